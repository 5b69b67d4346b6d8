#!/usr/bin/env bash
# What a session with a lent GPU runs: named steps, in the order given, each under a time
# limit, each result written as soon as it is measured, so that a call cut short still
# leaves what it measured. One device call runs at most 10 minutes: give each call the
# steps that fit, most valuable first.
#
#   bash bench/gpu-session.sh                       # roofline bars gpu-tests notebooks
#   bash bench/gpu-session.sh bars notebooks        # just these
#   LABS="08 09" bash bench/gpu-session.sh notebooks
#   BENCHES="matmul attention" bash bench/gpu-session.sh roofline benches
#   bash bench/gpu-session.sh profile               # Nsight Compute on PROFILES
#
# Steps: roofline (this card's ceilings, which every fraction is taken against), bars
# (each timed problem's solution against its bar, tests/test_solutions.py), gpu-tests (the
# other GPU tests), notebooks (the solved notebooks under nbval, one lab at a time), benches
# (`rooflab bench`, as JSON, gated against this card's newest record), suite (`make test`:
# the solved notebooks and the tests on 12 workers, correctness only, since they share
# the card; the GPU tests skipped there), profile (Nsight Compute on the kernels short of
# their anchors: each entry of PROFILES is "bench|kernel|shape", bench/profile.py's
# arguments). `test` and `bench` are the older names of `suite` and `roofline benches`.
#
# The GPU image has torch, triton, cupy and pytest but no nbval, nbclient, ipykernel,
# plotly or ipywidgets, and reaches no package index: run bench/gpu-wheels.sh first, on a
# machine that does, and carry the .whl/ folder it fills. Logs and JSON go to a results
# folder, packed after every step into $OUT/results.tgz (the device tool brings back few
# files); without $OUT they stay in bench/results/.
set -uo pipefail
# A fresh folder per call: a warm machine keeps /tmp from the call before.
if [ -n "${OUT:-}" ]; then results=$(mktemp -d /tmp/gpu-results.XXXX); else results=bench/results; fi
mkdir -p "$results"
export PYTHONUNBUFFERED=1
log="$results/session.log"
# Each failing test's report, written as it fails (tests/conftest.py): a step stopped by its
# time limit never prints pytest's summary.
export ROOFLAB_FAILURES="$results/failures.log"

pack() {
  [ -n "${OUT:-}" ] || return 0
  tar czf "$OUT/results.tgz.part" -C "$results" . && mv "$OUT/results.tgz.part" "$OUT/results.tgz"
}

# step LIMIT NAME COMMAND...: runs one step under a time limit, its output in NAME.log.
step() {
  local limit=$1 name=$2 start rc
  shift 2
  start=$(date +%s)
  echo "== $name (limit ${limit}s)" | tee -a "$log"
  timeout -k 10 "$limit" "$@" > "$results/$name.log" 2>&1
  rc=$?
  tail -n 25 "$results/$name.log" | tee -a "$log"
  echo "== $name: exit $rc after $(( $(date +%s) - start )) s" | tee -a "$log"
  pack
  return 0
}

steps="${*:-roofline bars gpu-tests notebooks}"
for one in $steps; do
  case "$one" in
    roofline|bars|gpu-tests|notebooks|benches|suite|profile|test|bench) ;;
    *) echo "unknown step '$one': roofline bars gpu-tests notebooks benches suite profile" >&2
       exit 2 ;;
  esac
done

if [ -d .whl ]; then
  # Into the image's own environment: what it already has is kept, the rest comes from .whl.
  python3 -m pip install -q --no-index --find-links .whl nbval nbclient ipykernel plotly \
    ipywidgets pytest-xdist 2>&1 | tail -3
fi
python3 -m pip install -q --no-deps --no-build-isolation -e . || exit 1
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -c 'import sys, torch, triton; print("python", sys.version.split()[0], "torch", torch.__version__, "triton", triton.__version__)'
  python3 -m rooflab.autograder.cli doctor; } 2>&1 | tee "$results/gpu.txt" | tee -a "$log"
notebooks=$(python3 -c "import nbval, nbclient, plotly, ipywidgets" 2>/dev/null && echo yes)
ncu=$(command -v ncu || ls /usr/local/cuda*/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -n 1)

# What limits the kernels short of their anchors (the issue's item 3), most wanted first.
PROFILES=${PROFILES:-"topk|rooflab topk_radix|256x262144 k=256;\
topk|torch.topk|256x262144 k=256;\
kmeans|assign + update_sorted|step n=1048576 d=128 k=1024;\
kmeans|rooflab update_sorted|update n=4194304 d=64 k=256 uniform;\
matmul|rooflab|4096x4096x4096 float32;\
attention|rooflab|fwd+bwd b4 h16 s4096 d128 causal"}


run_step() {
  case "$1" in
    roofline) step 60 roofline python3 -m rooflab.autograder.cli roofline --json "$results/" ;;
    bars) step 300 bars python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_solutions.py ;;
    gpu-tests) step 240 gpu-tests python3 -m pytest -m gpu -q -p no:cacheprovider tests \
                 --ignore tests/test_solutions.py ;;
    notebooks)
      if [ -z "$notebooks" ]; then
        echo "no nbval/nbclient/plotly/ipywidgets here: the notebooks are not run" | tee -a "$log"
        return
      fi
      for lab in ${LABS:-00 01 02 03 04 05 06 07 08 09 10}; do
        step 240 "nbval-$lab" python3 -m pytest -q -p no:cacheprovider --nbval-lax \
          --nbval-current-env solutions/${lab}_*.ipynb
      done ;;
    benches)
      for bench in ${BENCHES:-coalescing matmul softmax attention topk sampling kmeans amp allreduce fsdp}; do
        step 150 "bench-$bench" python3 -m rooflab.autograder.cli bench "$bench" \
          --json "$results/" --baseline newest
      done ;;
    suite)
      targets=(tests)
      [ -n "$notebooks" ] && targets=(--nbval-lax --nbval-current-env solutions tests)
      step 590 suite python3 -m pytest -q -p no:cacheprovider -n 12 --dist loadfile \
        "${targets[@]}" ;;
    profile)
      if [ -z "$ncu" ]; then
        echo "no ncu here: nothing profiled" | tee -a "$log"
        return
      fi
      local i=0
      IFS=';' read -ra entries <<< "$PROFILES"
      for entry in "${entries[@]}"; do
        IFS='|' read -r bench kernel shape <<< "$entry"
        i=$((i + 1))
        step 150 "ncu-$i-$bench" "$ncu" --profile-from-start off --target-processes all \
          --section SpeedOfLight --section MemoryWorkloadAnalysis \
          --section ComputeWorkloadAnalysis --section Occupancy --section LaunchStats \
          --section WarpStateStats --section SchedulerStats \
          python3 bench/profile.py "$bench" "$kernel" "$shape"
      done ;;
    test) run_step suite ;;
    bench) run_step roofline; run_step benches ;;
  esac
}

for one in $steps; do run_step "$one"; done
pack
