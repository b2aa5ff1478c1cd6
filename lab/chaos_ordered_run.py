"""The ordered crash test's run (scripts/chaos.py --ordered): lab.chaos_run's orchestration
(worker pool, paced publisher, SIGKILLs and forced closes at the event plan's progress points,
drain) with keyed messages published through the ordered topology's entry exchange, ordered
workers (lab.chaos_ordered_worker) and the per-key order summary (lab.chaos_ordered)."""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from amqp_lab.cli.progress import Progress
from amqp_lab.dedup import ManagedDedupStore
from amqp_lab.dlq.ops import browse, depth
from amqp_lab.errors import DedupStoreError
from amqp_lab.message import OutgoingMessage, message_for
from amqp_lab.settings import BrokerSettings
from amqp_lab.topology import load_topology
from amqp_lab.topology.model import Names
from amqp_lab.topology.ordered import with_ordered
from lab.chaos import _in_store
from lab.chaos_ordered import (
    KeySeq,
    ordered_invariant_holds,
    ordered_message_id,
    ordered_plan,
    ordered_summary,
    parse_message_id,
)
from lab.chaos_ordered_worker import FirstTryFaults
from lab.chaos_pool import Closer, PublisherThread, connection_name
from lab.chaos_run import ChaosPlan, ChaosRun


def ordered_names(shards: int) -> Names:
    """The ordered topology's roles (with_ordered over topology/definitions.json)."""
    return with_ordered(load_topology(), shards=shards).names


class OrderedPublisherThread(PublisherThread):
    """lab.chaos_pool.PublisherThread publishing the ordered plan: the seq-th message is
    ``plan[seq - 1]``'s (key, seq), body ``{"key": .., "seq": ..}``, message_id
    ``{key}-{seq}``, routed by its key (message_for ``key=``)."""

    def __init__(self, names: Names, plan: list[KeySeq], *args: Any) -> None:
        super().__init__(*args)
        self.names, self.plan = names, plan

    def message(self, seq: int) -> OutgoingMessage:
        key, key_seq = self.plan[seq - 1]
        body = {"key": key, "seq": key_seq}
        return message_for(self.names, body, message_id=ordered_message_id(key, key_seq), key=key)


def read_applied(store: ManagedDedupStore, run_id: str) -> list[KeySeq]:
    """The (key, seq) of every ledger row of ``run_id`` in applied order (SQLite: rowid,
    i.e. commit order under its one writer; PostgreSQL: applied_at). Raises DedupStoreError."""
    order = "rowid" if store.dialect == "sqlite" else "applied_at"
    sql = f"SELECT message_id FROM ledger WHERE run_id = ? ORDER BY {order}"
    rows = _in_store(store, "read the ledger", lambda db: db.execute(sql, (run_id,)).fetchall())
    parsed = [parse_message_id(str(row[0])) for row in rows]
    return [p for p in parsed if p is not None]


class OrderedChaosRun(ChaosRun):
    """One ordered run: ``keys`` keys over ``shards`` shard queues; ``faults`` is the SQLite
    file of the first-try failures (lab.chaos_ordered_worker.FirstTryFaults)."""

    def __init__(
        self,
        plan: ChaosPlan,
        settings: BrokerSettings,
        run_id: str,
        workdir: Path,
        worker_command: list[str],
        keys: int,
        shards: int,
        faults: Path,
        progress: Progress | None = None,
    ) -> None:
        super().__init__(plan, settings, run_id, workdir, worker_command, progress)
        self.names, self.keys, self.faults = ordered_names(shards), keys, faults
        self.publisher = OrderedPublisherThread(
            self.names,
            ordered_plan(plan.messages, keys, prefix=f"{run_id}.k"),
            replace(settings, connection_name=connection_name("publisher")),
            run_id,
            plan.messages,
            plan.duplicate_every,
            plan.publish_rate,
        )
        self.closer = Closer(settings, self.publisher, self.pool.names, self.rng, self.log)

    def shard_depth(self) -> int:
        """Messages in all shard queues now (queue.declare passive)."""
        return sum(depth(self.settings, q) for q in self.names.shard_queues)

    def drain(self) -> int:
        """Stop file, wait until every worker exited idle, start them again while a shard still
        holds messages. Returns the messages left (0 when drained)."""
        self.log("draining")
        return self.pool.drain(self.stop_file, self.shard_depth)

    def summary(self, store: ManagedDedupStore, left: int) -> dict[str, Any]:
        """lab.chaos_ordered.ordered_summary's counts, the run's own, ``invariant_holds``."""
        self.tally.update(self.pool.outputs)
        dlq_ids = [e.message_id for e in browse(self.settings, self.names.dlq) if e.message_id]
        published = [p for p in map(parse_message_id, self.publisher.confirmed) if p]
        counts = self.tally.counts
        try:
            applied = read_applied(store, self.run_id)
        except DedupStoreError:
            applied = []
        faults = FirstTryFaults(self.faults)
        try:
            injected = faults.count()
        finally:
            faults.close()
        summary = ordered_summary(published, applied, dlq_ids, counts["redelivered"])
        sample = summary.pop("out_of_order_sample")
        summary.update(
            mode="ordered",
            store=store.dialect,
            workers=self.plan.workers,
            shards=len(self.names.shard_queues),
            kills=self.kills,
            worker_closes=self.closer.closed["worker"],
            publisher_closes=self.closer.closed["publisher"],
            transient_failures_injected=injected,
            held_retries=counts["outcome:retried"],  # in the worker: outcome retried
            publish_retries=self.publisher.attempts - self.publisher.sent,
            publish_failed=len(self.publisher.failed),
            duplicates_skipped=counts["outcome:duplicate"],
            dead_lettered=counts["outcome:dead-lettered"],
            deliveries=counts["deliveries"],
            unexpected_worker_exits=self.pool.unexpected_exits,
            left_in_queue=left,
            seconds=round(time.monotonic() - self.started, 1),
        )
        if sample:
            summary["out_of_order_sample"] = sample
        summary["invariant_holds"] = ordered_invariant_holds(summary)
        return summary
