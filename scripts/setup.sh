#!/usr/bin/env bash
# Create .venv (once) with everything flortrain needs to run its demo and its tests.
# torch is pinned to the CPU build for development and CI; users bring their own torch.
# pip's output is kept out of the way and shown only if an install fails.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  echo "flortrain: creating .venv (the first time takes a minute)" >&2
  "$PY" -m venv .venv
fi
log=$(mktemp)
trap 'rm -f "$log"' EXIT
pip_install() {
  if ! .venv/bin/python -m pip install -q --disable-pip-version-check "$@" >"$log" 2>&1; then
    cat "$log" >&2
    echo "flortrain: pip install $* failed" >&2
    exit 1
  fi
}
pip_install -r requirements-dev.txt
pip_install --no-deps -e .
