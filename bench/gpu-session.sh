#!/usr/bin/env bash
# What a session with a lent GPU runs, in two calls that each fit a 10-minute command:
#
#   bash bench/gpu-session.sh test    # install; the whole suite as `make test` runs it, timed
#   bash bench/gpu-session.sh bench   # this card's ceilings and every benchmark, as JSON
#
# Logs and JSON go to $OUT (where the device tool collects files), else bench/results/.
# The GPU image has torch, triton, cupy and pytest but no JupyterLab, nbval or plotly:
# carry them as wheels in .whl/ (see the device tool's notes) to run the notebooks too.
set -uo pipefail
out=${OUT:-bench/results}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
fi
python3 -m pip install -q --no-deps --no-build-isolation -e . || exit 1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$out/gpu.txt"
python3 -m rooflab.autograder.cli doctor | tee -a "$out/gpu.txt"

case "${1:-test}" in
  test)
    if python3 -c "import nbval, nbclient, plotly" 2>/dev/null; then
      targets=(--nbval-lax --nbval-current-env tests solutions)
    else
      echo "no nbval/nbclient/plotly here: the notebooks are not run" | tee "$out/make-test.log"
      targets=(tests)
    fi
    start=$(date +%s)
    python3 -m pytest -q -ra "${targets[@]}" 2>&1 | tee -a "$out/make-test.log"
    echo "wall time of the suite on $(head -1 "$out/gpu.txt"): $(( $(date +%s) - start )) s" \
      | tee -a "$out/make-test.log"
    ;;
  bench)
    python3 -m rooflab.autograder.cli roofline --json "$out/" 2>&1 | tee "$out/bench.log"
    for bench in ${BENCHES:-coalescing matmul softmax attention topk sampling kmeans amp allreduce fsdp}; do
      python3 -m rooflab.autograder.cli bench "$bench" --json "$out/" --baseline newest 2>&1 \
        | tee -a "$out/bench.log"
    done
    ;;
  *) echo "usage: bash bench/gpu-session.sh test|bench" >&2; exit 2 ;;
esac
