#!/usr/bin/env bash
# Installs everything and runs the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
exec .venv/bin/python -m pytest -q -p no:cacheprovider --durations=30 "$@"
