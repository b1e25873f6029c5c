#!/usr/bin/env bash
# Installs everything and runs the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
# Two tests at a time (pytest-xdist; the tests that start several cold JVMs, xdist_group("cold-jvms"), one
# after another on one worker): on a quiet 2-core machine 1,601 s against 2,136 s one at a time, the same one
# failure in both (docs/history/22-test-suite.md). PHOTON_TEST_WORKERS=0 runs one at a time (so does a later
# `-n 0`); other arguments go to pytest.
workers=${PHOTON_TEST_WORKERS:-2}
parallel=()
if [ "$workers" != 0 ]; then
  parallel=(-n "$workers" --dist loadgroup)
fi
exec .venv/bin/python -m pytest -q -p no:cacheprovider --durations=30 "${parallel[@]}" "$@"
