"""The loss lab's scenario, the same for every design: publish N messages, start one worker
process, SIGKILL it F times at random moments while it processes (restarting it after each
kill), drain, then count from the effects table: lost (published, never applied) and processed
twice (applied more than once). Then memory per 100k messages kept."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from amqp_lab.cli.progress import Progress
from amqp_lab.settings import BrokerSettings
from lab.loss_lab import effects
from lab.loss_lab.catalog import DESIGNS
from lab.loss_lab.report import Row

ROOT = Path(__file__).resolve().parents[2]


class Design(Protocol):
    def load(self, ids: list[str], body_bytes: int) -> None: ...
    def remaining(self) -> int: ...
    def start_helpers(self) -> None: ...
    def stop_helpers(self) -> None: ...
    def memory(self, count: int, body_bytes: int) -> tuple[int, int, int]: ...
    def cleanup(self) -> None: ...


@dataclass(frozen=True)
class LabConfig:
    """``messages`` N, ``kills`` F, ``work_ms`` the per-message work range (ms), ``prefetch``
    basic.qos for RabbitMQ, ``stale`` seconds before a reaper / XAUTOCLAIM gives an entry
    back, ``maxlen`` the MAXLEN ~ of design 3b, ``kill_at`` "random" (0 - work_max after the
    target count) or "holding" (while the worker holds a received, unapplied message),
    ``memory_messages`` K loaded for the memory column (0: skip), ``offset_every`` effects
    between two stored stream offsets."""

    messages: int = 2000
    kills: int = 5
    seed: int = 1
    work_ms: tuple[float, float] = (1.0, 5.0)
    prefetch: int = 50
    stale: float = 1.0
    maxlen: int = 0  # 0: messages // 4
    kill_at: str = "random"
    body_bytes: int = 256
    memory_messages: int = 10_000
    offset_every: int = 10
    redis_url: str = "redis://127.0.0.1:6379/0"


class Run:
    """One design's run in ``workdir`` (effects db, worker output, settings.json).
    ``progress`` (a terminal's, silent in a pipe) shows the effects applied and the kills."""

    def __init__(
        self,
        key: str,
        config: LabConfig,
        workdir: Path,
        settings: BrokerSettings | None,
        progress: Progress | None = None,
    ) -> None:
        self.key, self.config, self.settings = key, config, settings
        self.progress = progress
        self.workdir = workdir / key
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.rng = random.Random(f"{config.seed}-{key}")
        self.prefix = f"amqp-lab:loss:{uuid.uuid4().hex[:10]}:"
        self.effects_path = self.workdir / (
            "dedup.sqlite3" if key == "dedup" else "effects.sqlite3"
        )
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0
        self.kills = 0
        self.log: list[str] = []
        self.maxlen = config.maxlen or max(1, config.messages // 4)

    def design(self) -> Design:
        if DESIGNS[self.key].family == "redis":
            from lab.loss_lab.redis_designs import RedisDesign

            maxlen = self.maxlen if self.key == "xstream-maxlen" else None
            return RedisDesign(
                self.key, self.config.redis_url, self.prefix, self.config.stale, maxlen
            )
        from lab.loss_lab.rabbit_designs import RabbitDesign

        if self.settings is None:
            raise ValueError(f"design {self.key} needs a RabbitMQ broker")
        design = RabbitDesign(self.key, self.settings, self.effects_path)
        design.setup()
        return design

    def _write_settings(self) -> None:
        c = self.config
        options = {
            "redis_url": c.redis_url,
            "prefix": self.prefix,
            "work_min": c.work_ms[0] / 1000,
            "work_max": c.work_ms[1] / 1000,
            "prefetch": c.prefetch,
            "stale": c.stale,
            "offset_every": c.offset_every,
            "amqp_url": self.settings.amqp_url if self.settings else "",
            "management_url": self.settings.management_url if self.settings else None,
        }
        path = self.workdir / "settings.json"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(options, f)
        (self.workdir / "holding").write_bytes(b"0")

    def start(self) -> None:
        self.starts += 1
        command = [sys.executable, "-m", "lab.loss_lab.worker", "--design", self.key]
        command += ["--workdir", str(self.workdir), "--effects", str(self.effects_path)]
        command += ["--seed", str(self.rng.randrange(1 << 30))]
        env = dict(os.environ, PYTHONPATH=str(ROOT))
        with (self.workdir / "worker.err").open("ab") as err:
            self.proc = subprocess.Popen(command, cwd=ROOT, env=env, stdout=err, stderr=err)

    def holding(self) -> bool:
        return (self.workdir / "holding").read_bytes()[:1] == b"1"

    def kill(self) -> None:
        """SIGKILL the worker (in the middle of processing) and start it again."""
        assert self.proc is not None
        if self.config.kill_at == "holding":
            deadline = time.monotonic() + 5
            while not self.holding() and time.monotonic() < deadline:
                time.sleep(0.0002)
        else:
            time.sleep(self.rng.uniform(0, self.config.work_ms[1] / 1000))
        self.proc.kill()
        self.proc.wait(30)
        self.kills += 1
        (self.workdir / "holding").write_bytes(b"0")
        self.start()

    def chaos(self, db_path: Path, available: int) -> None:
        """Kill the worker when the effect count reaches each of F random targets in
        1..available-1 (``available``: what the design kept of the N published);
        stop early when the count has not moved for 3 s (everything left was lost, or
        processed)."""
        n, f = available, self.config.kills
        targets = sorted(self.rng.sample(range(1, max(n, f + 1)), f))
        db = effects.connect(db_path)
        try:
            for target in targets:
                last, moved = -1, time.monotonic()
                while (count := effects.total(db)) < target:
                    if count != last:
                        last, moved = count, time.monotonic()
                        if self.progress is not None:
                            self.progress.update(count, f"kills {self.kills}/{f}")
                    if time.monotonic() - moved > 3:
                        self.log.append(f"stalled at {count} effects before target {target}")
                        return
                    time.sleep(0.001)
                self.kill()
        finally:
            db.close()

    def drain(self, design: Design) -> int:
        """Touch the stop file; wait for the worker to exit idle; start it again while the
        design still holds messages (ten rounds). Returns what is left."""
        (self.workdir / "stop").touch()
        if self.progress is not None:
            self.progress.update(self.progress.count, f"kills {self.kills}: draining")
        for _ in range(10):
            assert self.proc is not None
            try:
                self.proc.wait(120)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(30)
            left = design.remaining()
            if left == 0:
                return 0
            time.sleep(self.config.stale)  # let pending / processing entries become stale
            self.start()
        return design.remaining()

    def execute(self) -> Row:
        """The whole scenario for this design, then its memory column; the design's keys,
        queues and worker are cleaned up even on failure."""
        spec = DESIGNS[self.key]
        ids = [f"{self.key}-{i:06d}" for i in range(self.config.messages)]
        design = self.design()
        try:
            effects.connect(self.effects_path).close()
            self._write_settings()
            design.load(ids, self.config.body_bytes)
            design.start_helpers()
            self.start()
            self.chaos(self.effects_path, design.remaining())
            left = self.drain(design)
            design.stop_helpers()
            counts = effects.counts(self.effects_path)
            if self.progress is not None:
                self.progress.update(sum(counts.values()), f"kills {self.kills}: drained")
            memory, note = self.measure(design)
        finally:
            if self.proc is not None and self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait(30)
            design.cleanup()
        lost = sum(1 for i in ids if counts[i] == 0)
        trimmed = 0
        if self.key == "xstream-maxlen":
            trimmed = max(0, self.config.messages - len(counts))
        maxlen = f"MAXLEN ~ {self.maxlen}" if self.key == "xstream-maxlen" else "none"
        if spec.family == "rabbit" and self.key != "stream":
            maxlen = "none (x-max-length not set)"
        return Row(
            key=self.key,
            design=spec.title,
            published=len(ids),
            lost=lost,
            twice=sum(1 for i in ids if counts[i] > 1),
            effects=sum(counts[i] for i in ids),
            recovery=spec.recovery,
            memory_bytes=memory,
            memory_note=note,
            maxlen=maxlen,
            trimmed=trimmed,
            kills=self.kills,
            extra={"left_after_drain": left, "worker_starts": self.starts, "log": self.log},
        )

    def measure(self, design: Design) -> tuple[float | None, str]:
        """Bytes per 100k messages kept, scaled from K = memory_messages, and how."""
        k = self.config.memory_messages
        if k <= 0:
            return None, "not measured"
        first, second, kept = design.memory(k, self.config.body_bytes)
        scale = 100_000 / kept if kept else 0.0
        if DESIGNS[self.key].family == "redis":
            note = f"MEMORY USAGE, {kept} kept of {k}"
            if kept < k:
                note += f"; at most ~{kept} kept: {first / 1e6:.2f} MB in all"
            return first * scale, note
        if self.key == "stream":
            return first * scale, "queue process memory; entries in segment files on disk"
        return first * scale, f"queue memory; message_bytes {second * scale / 1e6:.1f} MB"
