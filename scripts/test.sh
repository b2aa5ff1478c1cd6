#!/usr/bin/env bash
# Lint, type-check and run every test (unit + integration against a real broker).
# Extra arguments go to pytest, e.g.  bash scripts/test.sh -m unit
#   AMQP_LAB_LINT=skip   skip ruff and mypy (CI runs them once, before its test stages)
#   AMQP_LAB_LINT=only   run ruff and mypy only
# A Docker engine that is installed but not running is started (as root), so the tests get
# their RabbitMQ 4.3 container; the broker chosen, and why, is printed before anything runs.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/_venv.sh
PY=$(venv_python)
BIN=$(dirname "$PY")
lint=${AMQP_LAB_LINT:-yes}
if [ "$lint" != "skip" ]; then
  # one command per line: under set -e a failure before && ends nothing (ruff's findings
  # passed unnoticed when ruff format's check then passed)
  echo "== ruff"; "$BIN/ruff" check .
  "$BIN/ruff" format --check .
  echo "== mypy"; "$BIN/mypy"  # files: pyproject.toml [tool.mypy]
fi
[ "$lint" = "only" ] && exit 0

start_docker() {  # an installed engine that is not running: start it, as .ci/run does
  command -v docker >/dev/null && command -v dockerd >/dev/null || return 0
  docker info >/dev/null 2>&1 && return 0
  if [ "$(id -u)" != 0 ]; then
    echo "== Docker is installed but not running, and starting it needs root" >&2
    return 0
  fi
  echo "== starting dockerd (installed, not running)"
  (nohup dockerd >/tmp/amqp-lab-dockerd.log 2>&1 &)
  for _ in $(seq 60); do docker info >/dev/null 2>&1 && return 0; sleep 1; done
  echo "== dockerd did not answer within 60 s (see /tmp/amqp-lab-dockerd.log)" >&2
}
if [ -z "${EAI_AMQP_URL:-}" ] && [ "${AMQP_LAB_TEST_BROKER:-}" != local ]; then
  start_docker
  export TESTCONTAINERS_RYUK_DISABLED=${TESTCONTAINERS_RYUK_DISABLED:-true}
fi
"$PY" -m tests.brokers
echo "== pytest"; exec "$BIN/pytest" "$@"
