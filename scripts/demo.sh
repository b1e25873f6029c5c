#!/usr/bin/env bash
# Installs everything and runs Photon's main job on embedded defaults (see README).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
exec .venv/bin/photon demo "$@"
