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
# fails; the gradebook is written either way (upload it as an artefact).
set -euo pipefail
COURSE=${COURSE:-course}
SUBMISSION=${SUBMISSION:-submission}
LEARNER=${LEARNER:-$(basename "$(realpath "$SUBMISSION")")}
OUT=${OUT:-gradebook}
if [ -z "${SKIP_INSTALL:-}" ]; then
  sudo=$([ "$(id -u)" = 0 ] || echo sudo)
  if ! command -v bwrap >/dev/null; then
    $sudo apt-get install -y -qq bubblewrap >/dev/null
  fi
  if [ -e /proc/sys/kernel/apparmor_restrict_unprivileged_userns ]; then
    $sudo sysctl -qw kernel.apparmor_restrict_unprivileged_userns=0
  fi
  # A CPU runner takes PyTorch's CPU build (200 MB, not several GB of CUDA).
  if ! command -v nvidia-smi >/dev/null; then
    python -m pip install -q torch --index-url https://download.pytorch.org/whl/cpu
  fi
  python -m pip install -q -e "$COURSE[lab]"
fi
# The learner is named by the folder graded: give the submission its learner's name.
named=$(mktemp -d)
ln -s "$(realpath "$SUBMISSION")" "$named/$LEARNER"
# shellcheck disable=SC2086  # GRADE_ARGS is a list of options
rooflab grade "$named/$LEARNER" --labs "$COURSE/labs" --out "$OUT" --require-pass \
  ${GRADE_ARGS:-}
