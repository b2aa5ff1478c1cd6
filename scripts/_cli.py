"""The scripts' shared plumbing: amqp_lab's command-line helpers, and the repository root on
sys.path so the scripts can import the lab (``lab/``), which is not part of the package."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from amqp_lab.cli.common import (  # noqa: E402
    EXIT_ALERT,
    EXIT_CANNOT_RESTART,
    EXIT_FAILED,
    EXIT_OK,
    EXIT_UNROUTABLE,
    run,
    settings_from_env,
)

__all__ = [
    "EXIT_ALERT",
    "EXIT_CANNOT_RESTART",
    "EXIT_FAILED",
    "EXIT_OK",
    "EXIT_UNROUTABLE",
    "ROOT",
    "run",
    "settings_from_env",
]
