#!/usr/bin/env bash
# Grade one learner's notebooks with rooflab, as a CI job does (see grade.yml beside it).
#
#   COURSE      the course as the class received it (`rooflab release` output), checked out
#               here; its autograder grades, its labs/ are the masters (default: course)
#   SUBMISSION  the folder holding the learner's notebooks (default: submission)
#   LEARNER     the name the gradebook gives them (default: the folder's name)
#   OUT         where the gradebook goes (default: gradebook)
#   GRADE_ARGS  more options for `rooflab grade` (e.g. "--cell-timeout 300")
#   SKIP_INSTALL=1  rooflab is installed already (a self-hosted runner, a test)
#
# Each notebook runs in a sandbox, bubblewrap, which this script installs where it can
# (apt-get) and allows to make its namespaces (Ubuntu 24.04 restricts them by default).
# On a CPU runner the gradebook holds correctness and predicted performance; on a GPU
# runner, measured roofline fractions. Exits 1 when an exercise did not pass, so the job
# fails; the gradebook is written either way (upload it as an artefact). Exits 2, before
# grading, when bubblewrap cannot run.
set -euo pipefail
COURSE=${COURSE:-course}
SUBMISSION=${SUBMISSION:-submission}
LEARNER=${LEARNER:-$(basename "$(realpath "$SUBMISSION")")}
OUT=${OUT:-gradebook}
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
  # A CPU runner takes PyTorch's CPU build (200 MB, not several GB of CUDA).
  if ! command -v nvidia-smi >/dev/null; then
    python -m pip install -q torch --index-url https://download.pytorch.org/whl/cpu
  fi
  python -m pip install -q -e "$COURSE[lab]"
fi
# Grading needs the sandbox: say why it cannot run before grading anything. With
# --unconfined in GRADE_ARGS, rooflab grades without it (and the gradebook says so).
if [[ " ${GRADE_ARGS:-} " != *" --unconfined "* ]]; then
  if ! command -v bwrap >/dev/null; then
    why="bubblewrap is not installed (apt-get install bubblewrap)"
  elif ! why=$(sandbox_runs 2>&1); then
    why="bubblewrap cannot make its namespaces here: ${why:-no message}"
  fi
  if [ -n "$why" ]; then
    echo "grade.sh: $why" >&2
    echo "grade.sh: grading runs each notebook in bubblewrap and needs it. Without it, the" \
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
rooflab grade "$named/$LEARNER" --labs "$COURSE/labs" --out "$OUT" --require-pass \
  ${GRADE_ARGS:-}
