#!/usr/bin/env bash
# Creates .venv (if missing), installs Photon with its test extras, and regenerates the gRPC stubs.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
.venv/bin/python -m pip install --quiet --disable-pip-version-check --upgrade pip
.venv/bin/python -m pip install --quiet --disable-pip-version-check -e '.[test]'
.venv/bin/python scripts/gen_protos.py
# Byte-compile Photon's own modules: an editable install leaves them uncompiled, and with
# PYTHONDONTWRITEBYTECODE set every process of a pipeline would compile them again at each start.
.venv/bin/python -m compileall -q photon idregistry eventstore dispatcher joiner millwheel bench >/dev/null
