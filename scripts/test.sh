#!/usr/bin/env bash
# Installs everything and runs the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
# One test at a time; arguments go to pytest, e.g. `-n 2 --dist loadgroup` for two at a time (pytest-xdist,
# README "Photon"; not the default, see docs/history/performance.md "Twentieth pass").
exec .venv/bin/python -m pytest -q -p no:cacheprovider --durations=30 "$@"
