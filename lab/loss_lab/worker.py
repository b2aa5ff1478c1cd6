"""A loss-lab worker process, started and SIGKILLed by :mod:`lab.loss_lab.runner`:

    python -m lab.loss_lab.worker --design KEY --workdir DIR [--seed S] ...

It reads its endpoints from ``DIR/settings.json`` (written by the runner, mode 0600, so no
password shows in a process listing), consumes with the design's client code, applies each
message as one row in the effects table, and returns once it has been idle for a second after
``DIR/stop`` appeared. Between receiving a message and applying it, it sleeps 1-5 ms (the
"work") with the hold marker set, so a kill lands in the middle of processing.
"""

from __future__ import annotations

import json
import os
import random
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path

from amqp_lab.cli.parser import CommandParser
from lab.loss_lab import effects

IDLE_EXIT = 1.0  # seconds without a message before the stop file is looked at


@dataclass
class WorkerContext:
    """What every design's loop needs: the effects db, the work time range (seconds), the stop
    file, the hold marker (``DIR/holding``, one byte: 1 while a message is held unapplied) and
    the run's options (``options``: settings.json plus the command line)."""

    db: sqlite3.Connection
    rng: random.Random
    work: tuple[float, float]
    workdir: Path
    options: dict[str, object]
    marker_fd: int

    def hold(self, holding: bool) -> None:
        """Set or clear the hold marker (a pwrite, no fsync: the runner reads it from the
        page cache)."""
        os.pwrite(self.marker_fd, b"1" if holding else b"0", 0)

    def process(self, message_id: str) -> None:
        """Hold, do the work (sleep), apply the effect (committed), release."""
        self.hold(True)
        time.sleep(self.rng.uniform(*self.work))
        effects.apply(self.db, message_id, time.time())
        self.hold(False)

    def should_stop(self, idle_since: float) -> bool:
        """True once idle for :data:`IDLE_EXIT` seconds with the stop file present."""
        return time.monotonic() - idle_since >= IDLE_EXIT and (self.workdir / "stop").exists()

    def option(self, name: str) -> str:
        return str(self.options[name])


def main() -> int:
    parser = CommandParser(description="loss-lab worker (started by the runner)")
    parser.add_argument("--design", required=True)
    parser.add_argument("--workdir", required=True, type=Path)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--effects", required=True, type=Path)
    args = parser.parse_args()
    options = json.loads((args.workdir / "settings.json").read_text())
    options["effects"] = str(args.effects)
    work = (float(options["work_min"]), float(options["work_max"]))
    marker_fd = os.open(args.workdir / "holding", os.O_RDWR | os.O_CREAT, 0o600)
    db = effects.connect(args.effects)
    context = WorkerContext(db, random.Random(args.seed), work, args.workdir, options, marker_fd)
    try:
        if args.design in ("brpop", "lmove", "xstream", "xstream-maxlen"):
            from lab.loss_lab import redis_designs

            redis_designs.work(args.design, context)
        else:
            from lab.loss_lab import rabbit_designs

            rabbit_designs.work(args.design, context)
    finally:
        db.close()
        os.close(marker_fd)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
