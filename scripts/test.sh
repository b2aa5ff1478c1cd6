#!/usr/bin/env bash
# Lint, type-check and run every test (unit + integration against a real broker).
# Extra arguments go to pytest, e.g.  bash scripts/test.sh -m unit
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/_venv.sh
PY=$(venv_python)
BIN=$(dirname "$PY")
echo "== ruff"; "$BIN/ruff" check . && "$BIN/ruff" format --check .
echo "== mypy"; "$BIN/mypy"  # files: pyproject.toml [tool.mypy]
echo "== pytest"; exec "$BIN/pytest" "$@"
