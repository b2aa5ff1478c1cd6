"""The crash test's run on one broker (scripts/chaos.py without --cluster): K worker
processes, the paced publisher, worker SIGKILLs and forced connection closes at the event plan's
progress points, the drain and the summary with its invariant (lab.chaos)."""

from __future__ import annotations

import random
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from amqp_lab.cli.progress import Progress
from amqp_lab.dedup import ManagedDedupStore
from amqp_lab.dlq.ops import browse, depth
from amqp_lab.management import ManagementClient
from amqp_lab.settings import BrokerSettings
from lab.chaos import Event, OutputTally, invariant_holds, read_ledger, summarize
from lab.chaos_pool import Closer, PublisherThread, WorkerPool, connection_name, wait_visible
from lab.chaos_worker import NAMES, QUEUE

STALL = 2.0  # seconds without a new delivery after publishing: fire the remaining events


@dataclass(frozen=True)
class ChaosPlan:
    """The crash test's size: ``messages`` (every ``duplicate_every``-th published twice, at
    most ``publish_rate`` per second, 0: no cap), ``kills`` worker SIGKILLs, ``workers`` worker
    processes, ``unsafe_auto_ack`` for the contrast run, ``seed`` for the event plan."""

    messages: int
    kills: int
    workers: int
    duplicate_every: int = 10
    publish_rate: float = 0.0
    unsafe_auto_ack: bool = False
    seed: int | None = None


class ChaosRun:
    """One run: K workers (``worker_command`` + ``--worker-process NAME``, stop file
    ``workdir/stop``), the publisher, the chaos events, the drain and the tally. ``progress``
    (a terminal's, silent in a pipe) shows the messages confirmed, deliveries and kills."""

    def __init__(
        self,
        plan: ChaosPlan,
        settings: BrokerSettings,
        run_id: str,
        workdir: Path,
        worker_command: list[str],
        progress: Progress | None = None,
    ) -> None:
        self.plan, self.settings, self.run_id = plan, settings, run_id
        self.progress = progress
        self.rng = random.Random(plan.seed)
        self.started = time.monotonic()
        self.stop_file = workdir / "stop"
        self.tally = OutputTally()
        self.kills = 0
        self.pool = WorkerPool(plan.workers, worker_command, workdir)
        self.publisher = PublisherThread(
            replace(settings, connection_name=connection_name("publisher")),
            self.run_id,
            plan.messages,
            plan.duplicate_every,
            plan.publish_rate,
        )
        self.closer = Closer(settings, self.publisher, self.pool.names, self.rng, self.log)

    def log(self, text: str) -> None:
        if self.progress is not None:
            self.progress.clear()  # the log line starts at column 0, not after the progress
        print(f"[{time.monotonic() - self.started:6.1f}s] {text}", flush=True)

    def start(self) -> None:
        """Open the publisher's connection and wait until the management API lists it (so it
        can be force-closed mid-publishing), start publishing, and start the workers once a
        fifth of the messages is confirmed: the workers then start with a backlog, so a kill or a
        forced close catches deliveries in flight (prefetched, or auto-acked and buffered)."""
        self.publisher.start()
        self.closer.start()
        with ManagementClient(self.settings) as api:
            if not wait_visible(api, self.settings.vhost, [connection_name("publisher")], 60):
                self.log("warning: the publisher's connection did not show within 60 s")
        self.publisher.go.set()
        head_start = max(1, self.plan.messages // 5)
        while len(self.publisher.confirmed) < head_start and self.publisher.is_alive():
            if self.progress is not None:
                self.progress.update(len(self.publisher.confirmed), "before the workers start")
            time.sleep(0.02)
        self.pool.start_all()
        self.log(
            f"{len(self.publisher.confirmed)} confirmed; {len(self.pool.names)} workers started"
        )

    def fire(self, event: Event) -> str:
        """Carry out one chaos event (closes happen in the background); describe it."""
        if event.kind == "kill":
            name = self.rng.choice(self.pool.busy(within=0.5) or self.pool.names)
            self.kills += 1
            return f"SIGKILL {name} (pid {self.pool.kill(name, self.rng)}), restarted"
        target = "publisher" if event.kind == "close-publisher" else "worker"
        self.closer.request(target)
        return f"force-close a {target} connection"

    def chaos_phase(self, events: list[Event]) -> None:
        """Fire each event at its progress point: deliveries seen (kills, worker closes) or
        messages confirmed (publisher closes); when progress stalls, fire what is left."""
        last_seen, last_change = -1, time.monotonic()
        while events or self.publisher.is_alive():
            seen = self.tally.update(self.pool.outputs)
            if seen != last_seen:
                last_seen, last_change = seen, time.monotonic()
            for line in self.pool.restart_exited():
                self.log(line)
            stalled = not self.publisher.is_alive() and time.monotonic() - last_change > STALL
            confirmed = len(self.publisher.confirmed)
            if self.progress is not None:
                note = f"deliveries {seen}, kills {self.kills}, events left {len(events)}"
                self.progress.update(confirmed, note)
            for event in events:
                progress = confirmed if event.kind == "close-publisher" else seen
                if progress >= event.at or stalled:
                    events.remove(event)
                    self.log(f"{self.fire(event)} (confirmed={confirmed} deliveries={seen})")
                    last_change = time.monotonic()
                    break
            time.sleep(0.05)
        self.closer.finish()

    def drain(self) -> int:
        """Stop file, wait until every worker exited idle, start them again while q:tasks still
        holds messages. Returns the messages left (0 when drained)."""
        self.log("draining")
        return self.pool.drain(self.stop_file, lambda: depth(self.settings, QUEUE))

    def summary(self, store: ManagedDedupStore, left: int) -> dict[str, Any]:
        """lab.chaos.summarize's counts, the run's own, and ``invariant_holds``."""
        self.tally.update(self.pool.outputs)
        dlq_ids = [e.message_id for e in browse(self.settings, NAMES.dlq) if e.message_id]
        counts = self.tally.counts
        summary: dict[str, Any] = summarize(
            self.publisher.confirmed,
            read_ledger(store, self.run_id),
            dlq_ids,
            counts["redelivered"],
        )
        summary.update(
            mode="unsafe-auto-ack" if self.plan.unsafe_auto_ack else "safe",
            store=store.dialect,
            workers=self.plan.workers,
            kills=self.kills,
            worker_closes=self.closer.closed["worker"],
            publisher_closes=self.closer.closed["publisher"],
            publish_retries=self.publisher.attempts - self.publisher.sent,
            publish_failed=len(self.publisher.failed),
            duplicates_skipped=counts["outcome:duplicate"],
            deliveries=counts["deliveries"],
            unexpected_worker_exits=self.pool.unexpected_exits,
            left_in_queue=left,
            seconds=round(time.monotonic() - self.started, 1),
        )
        summary["invariant_holds"] = invariant_holds(summary)
        return summary
