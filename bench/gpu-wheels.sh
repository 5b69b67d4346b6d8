#!/usr/bin/env bash
# Run on a machine with a package index, before a GPU session: downloads into .whl/ the
# wheels that the GPU image may lack to run the solved notebooks and the suite (nbval,
# nbclient, ipykernel, plotly, ipywidgets, pytest-xdist and what they need), built for the
# image's Python (3.12, x86-64 Linux).
# The GPU machine cannot reach an index, so bench/gpu-session.sh installs from .whl/ alone;
# the last step here checks that it can: every requirement resolves from the folder.
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PY:-python3}
target=(--only-binary=:all: --python-version 3.12 --implementation cp
        --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64
        --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64
        --platform manylinux_2_5_x86_64 --platform manylinux1_x86_64)
wanted=(nbval nbclient ipykernel plotly ipywidgets pytest-xdist)
rm -rf .whl && mkdir .whl
"$python" -m pip download -q "${target[@]}" -d .whl "${wanted[@]}"
"$python" -m pip install -q --dry-run --ignore-installed --no-index --find-links .whl \
  "${target[@]}" --target "$(mktemp -d)" "${wanted[@]}"
echo "$(ls .whl | wc -l) wheels, $(du -sh .whl | cut -f1), in .whl/: each requirement resolves from them"
