"""Designs 1-3 on Redis (redis-py): a list with LPUSH/BRPOP, a list with LMOVE to a processing
list plus a reaper, and a stream with a consumer group (XREADGROUP, XACK after the effect,
XAUTOCLAIM of entries pending longer than the stale time), with or without ``MAXLEN ~``.

Every key starts with the run's prefix (``amqp-lab:loss:{run_id}:``); :meth:`RedisDesign.cleanup`
deletes them all. https://redis.io/docs/latest/develop/data-types/lists/ and
https://redis.io/docs/latest/develop/data-types/streams/
"""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING, Any

import redis

if TYPE_CHECKING:
    from lab.loss_lab.worker import WorkerContext

GROUP = "lab"
# Return a stale entry from the processing list to the main list only if it is still there.
REAP = (
    "if redis.call('LREM', KEYS[1], 1, ARGV[1]) == 1 then "
    "redis.call('RPUSH', KEYS[2], ARGV[1]) return 1 end return 0"
)


def entry(message_id: str, body_bytes: int) -> bytes:
    """A list entry: ``id|padding`` of ``body_bytes`` bytes in all (ids are unique)."""
    head = message_id.encode() + b"|"
    return head + b"x" * max(0, body_bytes - len(head))


def entry_id(value: bytes) -> str:
    return value.split(b"|", 1)[0].decode()


class RedisDesign:
    """The runner's side of one Redis design: set up, load, how much is left, the reaper
    thread (LMOVE), memory per message kept, cleanup. ``stale``: seconds after which an entry
    in processing (LMOVE) or pending (stream) is given back."""

    def __init__(
        self, key: str, url: str, prefix: str, stale: float, maxlen: int | None = None
    ) -> None:
        self.key, self.prefix, self.stale, self.maxlen = key, prefix, stale, maxlen
        self.r = redis.Redis.from_url(url)
        self.main, self.processing = prefix + "main", prefix + "processing"
        self._reaper: threading.Thread | None = None
        self._stop = threading.Event()
        self.reaped = 0

    def load(self, ids: list[str], body_bytes: int) -> None:
        """Publish every id: LPUSH (lists) or XADD (stream; ``MAXLEN ~`` when set)."""
        pipe = self.r.pipeline(transaction=False)
        if self.key.startswith("xstream"):
            pipe.xgroup_create(self.main, GROUP, id="0", mkstream=True)
        for i, message_id in enumerate(ids, 1):
            if self.key.startswith("xstream"):
                fields = {"id": message_id, "body": entry(message_id, body_bytes)}
                pipe.xadd(self.main, fields, maxlen=self.maxlen, approximate=True)  # type: ignore[arg-type]
            else:
                pipe.lpush(self.main, entry(message_id, body_bytes))
            if i % 1000 == 0:
                pipe.execute()
        pipe.execute()

    def remaining(self) -> int:
        """Entries not yet settled: main + processing lists, or pending + undelivered."""
        if not self.key.startswith("xstream"):
            return int(self.r.llen(self.main)) + int(self.r.llen(self.processing))
        pending = int(self.r.xpending(self.main, GROUP)["pending"])
        groups: Any = self.r.xinfo_groups(self.main)
        last = groups[0]["last-delivered-id"].decode()
        undelivered = len(self.r.xrange(self.main, min="(" + last, max="+", count=1) or [])
        return pending + undelivered

    def start_helpers(self) -> None:
        """LMOVE only: the reaper thread, every stale/4 seconds."""
        if self.key == "lmove":
            self._reaper = threading.Thread(target=self._reap_loop, daemon=True)
            self._reaper.start()

    def stop_helpers(self) -> None:
        self._stop.set()
        if self._reaper is not None:
            self._reaper.join(10)

    def _reap_loop(self) -> None:
        """Entries seen in processing for longer than ``stale`` go back to the main list."""
        reap = self.r.register_script(REAP)
        seen: dict[bytes | str, float] = {}
        while not self._stop.wait(self.stale / 4):
            now = time.monotonic()
            current = set(self.r.lrange(self.processing, 0, -1))
            seen = {e: seen.get(e, now) for e in current}
            for value, first in list(seen.items()):
                if now - first >= self.stale and reap(
                    keys=[self.processing, self.main], args=[value]
                ):
                    self.reaped += 1
                    del seen[value]

    def memory(self, count: int, body_bytes: int) -> tuple[int, int, int]:
        """Load ``count`` entries under a separate key; (MEMORY USAGE of the key, INFO
        used_memory delta, entries kept), bytes. The key is deleted afterwards."""
        key = self.prefix + "memory"
        before = int(self.r.info("memory")["used_memory"])
        pipe = self.r.pipeline(transaction=False)
        for i in range(count):
            message_id = f"mem-{i:07d}"
            if self.key.startswith("xstream"):
                fields = {"id": message_id, "body": entry(message_id, body_bytes)}
                pipe.xadd(key, fields, maxlen=self.maxlen, approximate=True)  # type: ignore[arg-type]
            else:
                pipe.lpush(key, entry(message_id, body_bytes))
            if i % 1000 == 999:
                pipe.execute()
        pipe.execute()
        usage = int(self.r.memory_usage(key, samples=0) or 0)
        delta = int(self.r.info("memory")["used_memory"]) - before
        kept = int(self.r.xlen(key)) if self.key.startswith("xstream") else count
        self.r.delete(key)
        return usage, max(delta, 0), kept

    def cleanup(self) -> None:
        """Delete every key of this run's prefix."""
        self.stop_helpers()
        keys = list(self.r.scan_iter(match=self.prefix + "*", count=1000))
        if keys:
            self.r.delete(*keys)
        self.r.close()


def work(design: str, ctx: WorkerContext) -> None:
    """The worker loop of a Redis design (see the module doc)."""
    r = redis.Redis.from_url(ctx.option("redis_url"))
    prefix = ctx.option("prefix")
    main, processing = prefix + "main", prefix + "processing"
    idle = time.monotonic()
    if design.startswith("xstream"):
        _stream_loop(r, ctx, main)
        return
    while True:
        if design == "brpop":
            popped: Any = r.brpop([main], timeout=0.5)
            value = popped[1] if popped else None
        else:
            value = r.blmove(main, processing, 1, "RIGHT", "LEFT")
        if value is None:
            if ctx.should_stop(idle):
                return
            continue
        ctx.process(entry_id(value))
        if design == "lmove":
            r.lrem(processing, 1, value)
        idle = time.monotonic()


def _stream_loop(r: redis.Redis, ctx: WorkerContext, stream: str) -> None:
    """XAUTOCLAIM entries pending longer than the stale time (other, dead consumers'), else
    XREADGROUP new ones; XACK after each effect."""
    consumer = f"worker-{time.time_ns()}"
    stale_ms = int(float(ctx.option("stale")) * 1000)
    idle = time.monotonic()
    next_claim = 0.0
    while True:
        batch: list[Any] = []
        if time.monotonic() >= next_claim:
            claimed: Any = r.xautoclaim(stream, GROUP, consumer, stale_ms, "0-0", count=100)
            batch = [m for m in claimed[1] if m[1]]
            next_claim = time.monotonic() + stale_ms / 4000
        if not batch:
            read: Any = r.xreadgroup(GROUP, consumer, {stream: ">"}, count=1, block=250)
            batch = read[0][1] if read else []
        if not batch:
            if ctx.should_stop(idle):
                return
            continue
        for entry_key, fields in batch:
            ctx.process(fields[b"id"].decode())
            r.xack(stream, GROUP, entry_key)
        idle = time.monotonic()
