#!/usr/bin/env bash
# The whole demo on a real broker: venv + install, a broker (scripts/broker.py's node when
# EAI_AMQP_URL is unset), topology, publish, worker, DLQ, replay, durability across a restart.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/_venv.sh
PY=$(venv_python)
exec "$PY" scripts/demo.py "$@"
