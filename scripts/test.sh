#!/usr/bin/env bash
# Installs everything and runs the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
# Two tests at a time (pytest-xdist; the tests marked xdist_group run one after another on one worker), see the
# README. PHOTON_TEST_WORKERS=0 runs one test at a time; other arguments go to pytest (a later `-n 0` wins too).
workers="${PHOTON_TEST_WORKERS:-2}"
exec .venv/bin/python -m pytest -q -p no:cacheprovider --durations=30 -n "$workers" --dist loadgroup "$@"
