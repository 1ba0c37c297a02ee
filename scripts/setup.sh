#!/usr/bin/env bash
# Create .venv (once) with everything flortrain needs to run its demo and its tests.
# torch is pinned to the CPU build for development and CI; users bring their own torch.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
.venv/bin/python -m pip install -q --disable-pip-version-check -r requirements-dev.txt
.venv/bin/python -m pip install -q --disable-pip-version-check --no-deps -e .
