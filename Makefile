# The two commands a newcomer needs: `make lab` and `make test`.
# Both create .venv with the Python on PATH (3.10 or newer) and install what is needed.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# The versions CI tested: `make lab` and `make test` install under these constraints, the
# same file `rooflab grade`'s CI template installs under, so a newcomer gets what CI ran.
# `CONSTRAINTS=none` takes the newest the index serves (a venv made under the pins is
# upgraded, and made under them again by the next plain `make`).
CONSTRAINTS ?= ci/templates/constraints.txt
PINNED := $(if $(filter none,$(CONSTRAINTS)),,$(CONSTRAINTS))
PIP_INSTALL := $(BIN)/python -m pip install -q \
	$(if $(PINNED),-c $(PINNED),--upgrade --upgrade-strategy eager)
# One stamp per setting: switching between the pins and the newest installs again.
STAMP := $(VENV)/.installed-$(if $(PINNED),pinned,newest)
# torch to install if the venv has none, within the constraints (torch 2.13.0 there: on
# Linux pip's default index serves a CUDA build of several GB, see TORCH_INDEX).
TORCH ?= torch>=2.4
# An extra package index to take torch from: on a machine without a GPU, PyTorch's CPU
# builds, `make test TORCH_INDEX=https://download.pytorch.org/whl/cpu` (about 200 MB).
TORCH_INDEX ?=
# Extra arguments, e.g. `make lab LAB_ARGS="--no-browser --port 8899"`.
LAB_ARGS ?=
PYTEST_ARGS ?=
OUT ?= bench/results

# JupyterLab refuses to start as root unless told it may (containers often run as root).
ALLOW_ROOT := $(if $(filter 0,$(shell id -u)),--allow-root,)

.PHONY: lab test lint build book record browser-test gpu-check gpu-test gpu-notebooks gpu-bench clean

$(BIN)/python:
	$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 10), "rooflab needs Python 3.10+"'
	$(PYTHON) -m venv $(VENV)

$(STAMP): pyproject.toml $(PINNED) | $(BIN)/python
	rm -f $(VENV)/.installed-*
	$(PIP_INSTALL) $(if $(TORCH_INDEX),--extra-index-url $(TORCH_INDEX)) "$(TORCH)"
	$(PIP_INSTALL) -e ".[lab,dev]"
	$(BIN)/rooflab doctor
	touch $(STAMP)

lab: $(STAMP)
	$(BIN)/jupyter lab --notebook-dir=labs $(ALLOW_ROOT) $(LAB_ARGS)

# The unit tests, the learner notebooks (each must fail only at its checks), and every
# solved notebook run end to end by nbval (each must pass).
# In parallel, one worker per core (pytest-xdist); a file stays on one worker, so a
# notebook's cells run in order in one kernel. The solved notebooks, the longest files,
# are handed out first, so that the short test files even out the workers at the end.
test: $(STAMP)
	$(BIN)/python -m pytest -n auto --dist loadfile --nbval-lax --nbval-current-env \
		$(PYTEST_ARGS) $(wildcard solutions) tests

# ruff, then the autograder's layers (import-linter, the contracts in pyproject.toml): a
# module imports only from the layers under its own, and nothing imports in a circle.
lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/lint-imports

# After editing a lab master in book/: regenerate labs/ and solutions/, then commit them.
build: $(STAMP)
	$(BIN)/rooflab build

# The course as a website, in book/_build/html: the learner notebooks of labs/ with the
# outputs recorded in book/recorded/, and the concept pages of book/concepts/, built by
# mystmd (Jupyter Book 2), pinned in book/package-lock.json and installed in
# book/node_modules. Needs Node.js 18+ and npm, not .venv. Look at it with
# `python3 -m http.server -d book/_build/html`. Its launch buttons point where
# ROOFLAB_JUPYTERLAB_URL says, if set (`none`: no button), else where book/myst.yml says.
book: book/node_modules/.package-lock.json
	cd book && node_modules/.bin/myst build --html

# Run every solved notebook (or those named: `make record LABS="00_roofline 03_softmax"`) and
# keep its outputs, laid on the learner's cells, in book/recorded/ for the book; commit them.
# On a GPU it records measurements; without one, predictions (five to ten minutes). Its
# charts are drawn in Chromium, as the browser tests' are. Not run by CI.
LABS ?=
record: $(STAMP)
	$(BIN)/python -m rooflab.autograder.course.record $(LABS)

book/node_modules/.package-lock.json: book/package.json book/package-lock.json
	@command -v npm >/dev/null || { echo "make book needs Node.js 18+ and npm"; exit 1; }
	cd book && npm ci --no-audit --no-fund

# Lab 00 run in JupyterLab and the built book, each in headless Chromium (Debian's
# /usr/bin/chromium: `apt-get install chromium`); screenshots in build/screenshots/.
browser-test: $(STAMP) book
	$(BIN)/python -m pytest $(PYTEST_ARGS) tests/browser

# On a GPU machine `make test` grades correctness only (its workers share the card; see
# tests/conftest.py), and these run one at a time with the card to themselves:
# the GPU tests (the course's solutions held to their bars among them),
# every solved notebook under nbval, then this card's ceilings and the benchmarks as JSON
# in $(OUT)/ (<card>-<date>[-<bench>].json). PY is the interpreter rooflab is installed in;
# `make test` or `pip install --no-deps -e .` installs it. With little GPU time, run the
# parts one by one: `make gpu-test`, `make gpu-notebooks`, then
# `make gpu-bench BENCHES="matmul attention"`.
PY ?= $(if $(wildcard $(BIN)/python),$(BIN)/python,python3)
BENCHES ?= coalescing matmul softmax attention topk sampling kmeans amp allreduce fsdp
gpu-check: gpu-test gpu-notebooks gpu-bench

gpu-test:
	$(PY) -m pytest -m gpu -q tests

gpu-notebooks:
	@$(PY) -c 'import nbval, nbclient, plotly' 2>/dev/null || { echo "gpu-notebooks needs nbval, nbclient and plotly: pip install '.[lab,dev]'"; exit 1; }
	$(PY) -m pytest --nbval-lax --nbval-current-env -q solutions

# Each bench is gated against this card's newest record in bench/results/: a course kernel
# whose speed relative to the library fell by more than 5% and more than the spread of its
# repeated runs fails it (see the README's benchmarks paragraph).
gpu-bench:
	$(PY) -m rooflab.autograder.cli roofline --json $(OUT)/
	status=0; for bench in $(BENCHES); do \
		$(PY) -m rooflab.autograder.cli bench $$bench --json $(OUT)/ --baseline newest \
			|| status=1; \
	done; exit $$status

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .import_linter_cache .grimp_cache \
		book/node_modules book/_build build
