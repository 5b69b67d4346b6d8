#!/usr/bin/env bash
# Grade one learner's notebooks with rooflab, as a CI job does (see grade.yml beside it).
#
#   COURSE      the course as the class received it (`rooflab release` output), checked out
#               here; its autograder grades, its labs/ are the masters (default: course)
#   SUBMISSION  the folder holding the learner's notebooks (default: submission)
#   LEARNER     the name the gradebook gives them (default: the folder's name)
#   LABS        which labs: "changed" (default: the labs the learner has begun, so a
#               learner who finished labs 00-01 is not failed on 02-09), or numbers, 00,01
#   OUT         where the gradebook goes (default: gradebook)
#   VENV        a virtual environment to install the course into and grade from; kept
#               between runs (the workflow caches it), it is reused while the course's
#               pyproject.toml and constraints.txt are unchanged (default: .venv-grade)
#   GRADE_ARGS  more options for `rooflab grade` (e.g. "--cell-timeout 300")
#   SKIP_INSTALL=1  rooflab is installed already in the Python on PATH (a test)
#
# Each notebook runs in a sandbox, bubblewrap, which this script installs where it can
# (apt-get) and allows to make its namespaces (Ubuntu 24.04 restricts them by default).
# On a CPU runner the gradebook holds correctness and predicted performance; on a GPU
# runner, measured roofline fractions. Exits 1 when an exercise failed or is not written
# yet (NEEDS A GPU, on a CPU, fails nothing), so the job fails; the gradebook is written
# as results arrive and at the end either way (upload it as an artefact). Exits 2, before
# grading, when bubblewrap cannot run.
set -euo pipefail
COURSE=${COURSE:-course}
SUBMISSION=${SUBMISSION:-submission}
LEARNER=${LEARNER:-$(basename "$(realpath "$SUBMISSION")")}
OUT=${OUT:-gradebook}
LABS=${LABS:-changed}
VENV=${VENV:-.venv-grade}
PYTHON=$(command -v python3 || command -v python)
sandbox_runs() { bwrap --unshare-all --die-with-parent --ro-bind / / true; }
if [ -z "${SKIP_INSTALL:-}" ]; then
  sudo=$([ "$(id -u)" = 0 ] || echo sudo)
  if ! command -v bwrap >/dev/null; then
    # A fresh runner's package lists are empty or stale: update them first.
    { $sudo apt-get update -qq &&
      $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bubblewrap >/dev/null; } ||
      echo "grade.sh: bubblewrap could not be installed (apt-get failed)" >&2
  fi
  # Ubuntu 24.04 keeps unprivileged programs from making user namespaces. The sysctl lifts
  # that for the whole machine until reboot: on a self-hosted runner an admin may prefer
  # an AppArmor profile that allows bwrap alone. So it runs only where bwrap fails.
  restricted=/proc/sys/kernel/apparmor_restrict_unprivileged_userns
  if command -v bwrap >/dev/null && ! sandbox_runs 2>/dev/null &&
     [ "$(cat "$restricted" 2>/dev/null)" = 1 ]; then
    # In a container /proc/sys is read-only: say so, and let the check below decide.
    $sudo sysctl -qw kernel.apparmor_restrict_unprivileged_userns=0 ||
      echo "grade.sh: could not set kernel.apparmor_restrict_unprivileged_userns=0" \
           "(/proc/sys read-only, as in a container?)" >&2
  fi
  # The course in an environment of its own, at the versions it was tested with. A cached
  # environment is reused while the course's pyproject.toml, its constraints and the
  # Python that made it are unchanged, and that Python still runs.
  constraints="$COURSE/ci/templates/constraints.txt"
  base=$(command -v python3 || command -v python)
  stamp=$({ cat "$COURSE/pyproject.toml" "$constraints"; "$base" -VV; } | sha256sum | cut -c1-16)
  if [ "$(cat "$VENV/.rooflab-stamp" 2>/dev/null)" != "$stamp" ] ||
     ! "$VENV/bin/python" -c "import rooflab" 2>/dev/null; then
    rm -rf "$VENV"
    "$base" -m venv "$VENV"
    extras=lab
    if command -v nvidia-smi >/dev/null; then
      extras=lab,gpu  # CuPy: the CUDA C exercises run, not only compile
    else
      # A CPU runner takes PyTorch's CPU build (200 MB, not several GB of CUDA).
      "$VENV/bin/python" -m pip install -q -c "$constraints" torch \
        --index-url https://download.pytorch.org/whl/cpu
    fi
    # Editable: the cached environment holds the dependencies; the course is read from
    # its checkout, so an update to the course needs no new environment.
    "$VENV/bin/python" -m pip install -q -c "$constraints" -e "$COURSE[$extras]"
    echo "$stamp" > "$VENV/.rooflab-stamp"
  fi
  PYTHON="$VENV/bin/python"
fi
# Grading needs the sandbox: say why it cannot run before grading anything, trying the
# very sandbox rooflab makes (its own pid namespace and /proc, which Docker's default
# profiles refuse). With --unconfined in GRADE_ARGS, rooflab grades without it (and the
# gradebook says so).
if [[ " ${GRADE_ARGS:-} " != *" --unconfined "* ]]; then
  why=$("$PYTHON" -c 'from rooflab.autograder.confine import why_unavailable
print(why_unavailable())' 2>&1) || why="rooflab could not be imported: $why"
  if [ -n "$why" ]; then
    echo "grade.sh: $why" >&2
    echo "grade.sh: grading runs each notebook in bubblewrap and needs it. In a Docker" \
         "container, run it with --security-opt seccomp=unconfined --security-opt" \
         "apparmor=unconfined --security-opt systempaths=unconfined. Without it, the" \
         "notebooks may run unconfined, with this runner's rights: set" \
         "GRADE_ARGS=--unconfined, which rooflab allows only where the course was" \
         "installed from a release." >&2
    exit 2
  fi
fi
# The learner is named by the folder graded: give the submission its learner's name.
named=$(mktemp -d)
ln -s "$(realpath "$SUBMISSION")" "$named/$LEARNER"
# shellcheck disable=SC2086  # GRADE_ARGS is a list of options
"$PYTHON" -m rooflab.autograder.cli grade "$named/$LEARNER" --course "$COURSE" \
  --labs "$LABS" --out "$OUT" --require-pass ${GRADE_ARGS:-}
