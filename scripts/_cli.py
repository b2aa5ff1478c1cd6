"""The scripts' shared plumbing: amqp_lab's command-line helpers, and the repository root on
sys.path so the scripts can import the lab (``lab/``), which is not part of the package.

A script started by another interpreter than the repository's ``.venv`` (``python3
scripts/worker.py`` from a fresh shell) re-executes itself with the venv's Python, so every
command the README shows runs as written; without a ``.venv`` it says how to make one.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VENV_PYTHON = ROOT / ".venv" / "bin" / "python"


DEPENDENCIES = ("pika", "tenacity", "httpx", "psycopg")


def _use_the_venv() -> None:
    """Re-execute with the repository's .venv Python when it exists and is not this one; else
    run here if this Python has amqp-lab's dependencies, or exit with one line saying how."""
    if Path(sys.prefix).resolve() == (ROOT / ".venv").resolve():
        return
    if VENV_PYTHON.exists():
        os.execv(str(VENV_PYTHON), [str(VENV_PYTHON), *sys.argv])
    missing = [name for name in DEPENDENCIES if importlib.util.find_spec(name) is None]
    if missing:
        sys.exit(
            f"error: this Python lacks {', '.join(missing)}: run `bash scripts/demo.sh` or "
            "`bash scripts/test.sh` once (they create .venv), or `pip install -e .`"
        )


_use_the_venv()
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from amqp_lab.cli.common import (  # noqa: E402
    EXIT_ALERT,
    EXIT_CANNOT_RESTART,
    EXIT_FAILED,
    EXIT_OK,
    EXIT_UNROUTABLE,
    add_topology_option,
    load_callable,
    run,
    settings_from_env,
    topology_from,
)

__all__ = [
    "EXIT_ALERT",
    "EXIT_CANNOT_RESTART",
    "EXIT_FAILED",
    "EXIT_OK",
    "EXIT_UNROUTABLE",
    "ROOT",
    "add_topology_option",
    "load_callable",
    "run",
    "settings_from_env",
    "topology_from",
]
