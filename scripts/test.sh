#!/usr/bin/env bash
# Set up (if needed) and run every check: lint, types, and the test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/ruff check flortrain tests benchmarks
.venv/bin/ruff format --check flortrain tests benchmarks
.venv/bin/mypy
.venv/bin/mypy benchmarks  # scripts, not a package: checked as files
.venv/bin/lint-imports  # the layers, no cycles, no torch on the static side: pyproject.toml
.venv/bin/python -m pytest -n 2 --dist worksteal -q --durations=25 "$@"
