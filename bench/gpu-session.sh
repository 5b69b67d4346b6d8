#!/usr/bin/env bash
# What a session with a lent GPU runs. Each mode fits one 10-minute command and writes each
# result as soon as it is measured, so a run cut short still leaves what it measured:
#
#   bash bench/gpu-session.sh first   # the labs' GPU paths, most valuable first (below)
#   bash bench/gpu-session.sh test    # the whole suite as `make test` runs it, timed
#   bash bench/gpu-session.sh bench   # this card's ceilings and every benchmark, as JSON
#
# The GPU image has torch, triton, cupy and pytest but no nbval, nbclient, ipykernel,
# plotly or ipywidgets, and reaches no package index: run bench/gpu-wheels.sh first, on a
# machine that does, and carry the .whl/ folder it fills. Logs and JSON go to a results
# folder, packed after every step into $OUT/results.tgz (the device tool brings back few
# files); without $OUT they stay in bench/results/.
set -uo pipefail
results=${OUT:+/tmp/gpu-results}
results=${results:-bench/results}
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

if [ -d .whl ]; then
  # Into the image's own environment: what it already has is kept, the rest comes from .whl.
  python3 -m pip install -q --no-index --find-links .whl nbval nbclient ipykernel plotly \
    ipywidgets 2>&1 | tail -3
fi
python3 -m pip install -q --no-deps --no-build-isolation -e . || exit 1
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -c 'import sys, torch, triton; print("python", sys.version.split()[0], "torch", torch.__version__, "triton", triton.__version__)'
  python3 -m rooflab.autograder.cli doctor; } 2>&1 | tee "$results/gpu.txt" | tee -a "$log"
notebooks=$(python3 -c "import nbval, nbclient, plotly, ipywidgets" 2>/dev/null && echo yes)

# benches LIMIT NAME...: one step per benchmark, each gated against this card's newest record.
benches() {
  local limit=$1 bench
  shift
  for bench in "$@"; do
    step "$limit" "bench-$bench" python3 -m rooflab.autograder.cli bench "$bench" \
      --json "$results/" --baseline newest
  done
}

case "${1:-first}" in
  first)
    # 1. this card's ceilings, which every roofline fraction below is taken against;
    # 2. each timed problem's solution against its bar; 3. the benchmarks of labs 05-07
    # (never measured); 4. the other GPU tests; 5. the solved notebooks of labs 05-09.
    step 60 roofline python3 -m rooflab.autograder.cli roofline --json "$results/"
    step 150 bars python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_solutions.py
    benches 75 ${FIRST_BENCHES:-topk sampling kmeans amp}
    step 120 gpu-tests python3 -m pytest -m gpu -q -p no:cacheprovider tests \
      --ignore tests/test_solutions.py
    if [ -n "$notebooks" ]; then
      for lab in 05 06 07 08 09; do
        step 120 "nbval-$lab" python3 -m pytest -q -p no:cacheprovider --nbval-lax \
          --nbval-current-env solutions/${lab}_*.ipynb
      done
    else
      echo "no nbval/nbclient/plotly/ipywidgets here: the notebooks are not run" | tee -a "$log"
    fi
    ;;
  test)
    targets=(tests)
    [ -n "$notebooks" ] && targets=(--nbval-lax --nbval-current-env tests solutions)
    step 590 make-test python3 -m pytest -q -ra -p no:cacheprovider "${targets[@]}"
    ;;
  bench)
    step 60 roofline python3 -m rooflab.autograder.cli roofline --json "$results/"
    benches 150 ${BENCHES:-coalescing matmul softmax attention topk sampling kmeans amp allreduce fsdp}
    ;;
  *) echo "usage: bash bench/gpu-session.sh first|test|bench" >&2; exit 2 ;;
esac
pack
