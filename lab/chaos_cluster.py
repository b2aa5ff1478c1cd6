"""The cluster crash test (``scripts/chaos.py --cluster``): the publisher, the workers, the
leader kills (lab.leader_kills), the drain, and the summary with its invariant (lab.chaos' counts,
lab.failover's per-kill report). The publisher and the workers take the cluster's whole
address list, so they move on to a live node when theirs dies.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from amqp_lab.cli.progress import Progress
from amqp_lab.dedup import ManagedDedupStore
from amqp_lab.dlq.ops import browse, depth
from amqp_lab.errors import ConfigurationError
from amqp_lab.settings import BrokerSettings
from lab.chaos import OutputTally, read_ledger, summarize
from lab.chaos_pool import WorkerPool, connection_name
from lab.chaos_publisher import GatedPublisher
from lab.chaos_worker import NAMES, QUEUE
from lab.failover import confirmed_ids, failover_holds, kill_reports
from lab.leader_kills import ClusterChaos, ClusterControl


def check_addresses(settings: BrokerSettings, node_urls: list[str]) -> None:
    """Raise ConfigurationError unless ``settings`` (EAI_AMQP_URL) names every node of
    ``node_urls`` (host and port), so clients can move on to a live node when theirs dies."""
    have = {(a.host, a.port) for a in settings.addresses()}
    want = [BrokerSettings(url) for url in node_urls]
    missing = [f"{w.host}:{w.port}" for w in want if (w.host, w.port) not in have]
    if missing:
        raise ConfigurationError(
            f"--cluster: EAI_AMQP_URL names {', '.join(f'{h}:{p}' for h, p in sorted(have))} "
            f"but not the cluster's {', '.join(missing)}; list every node: "
            'eval "$(python scripts/cluster.py env --vhost VHOST)"'
        )


def _publisher_error(publisher: GatedPublisher) -> str | None:
    """What stopped the publisher early, or that it never finished; None when it did."""
    if publisher.is_alive():
        return "still publishing at the end of the run"
    return None if publisher.error is None else str(publisher.error)


@dataclass(frozen=True)
class ClusterChaosPlan:
    """The cluster run's size: ``messages`` (every ``dup_every``-th published twice), ``kills``
    leader kills, ``workers`` worker processes, at most ``rate`` messages per second (0: no
    cap) and ``window`` unconfirmed publishes."""

    messages: int
    kills: int
    workers: int
    dup_every: int = 10
    rate: float = 0.0
    window: int = 50


def run_cluster_chaos(
    cluster: ClusterControl,
    settings: BrokerSettings,
    store: ManagedDedupStore,
    plan: ClusterChaosPlan,
    worker_command: list[str],
    run_id: str,
    workdir: Path,
    log: Callable[[str], None],
    progress: Progress | None = None,
) -> dict[str, Any]:
    """The whole cluster run on ``settings``' vhost (the quorum topology applied, q:tasks
    empty): workers started with ``worker_command`` (plus ``--worker-process NAME``), the leader
    kills, the drain (stop file in ``workdir``), and the summary: lab.chaos' counts, one dict
    per kill under ``failovers`` (lab.failover.kill_reports plus :meth:`Failover.facts`) and
    ``invariant_holds`` (lab.failover.failover_holds). ``progress``: shown while it runs (a
    terminal's, silent in a pipe)."""
    started = time.monotonic()
    tally = OutputTally()
    pool = WorkerPool(plan.workers, worker_command, workdir)
    publisher = GatedPublisher(
        replace(settings, connection_name=connection_name("publisher")),
        run_id,
        plan.messages,
        plan.dup_every,
        plan.rate,
        plan.window,
    )
    chaos = ClusterChaos(cluster, settings, QUEUE, publisher, pool, tally, log, progress=progress)
    try:
        publisher.start()
        failovers = chaos.run(plan.kills)
        log("draining")
        left = pool.drain(workdir / "stop", lambda: depth(settings, QUEUE))
    finally:
        pool.kill_all()
        publisher.join(5)
    tally.update(pool.outputs)
    records = publisher.records
    dlq_ids = [e.message_id for e in browse(settings, NAMES.dlq) if e.message_id]
    summary: dict[str, Any] = summarize(
        confirmed_ids(records), read_ledger(store, run_id), dlq_ids, tally.counts["redelivered"]
    )
    reports = kill_reports([f.kill for f in failovers], records, tally.settled)
    summary.update(
        mode="cluster",
        workers=plan.workers,
        kills=len(failovers),
        publishes=len(records),
        publish_failed=sum(1 for r in records if r.done_at is not None and not r.confirmed),
        publisher_reconnects=publisher.reconnects,
        publisher_error=_publisher_error(publisher),
        duplicates_skipped=tally.counts["outcome:duplicate"],
        deliveries=tally.counts["deliveries"],
        unexpected_worker_exits=pool.unexpected_exits,
        left_in_queue=left,
        seconds=round(time.monotonic() - started, 1),
        failovers=[r | f.facts() for r, f in zip(reports, failovers, strict=True)],
    )
    summary["invariant_holds"] = failover_holds(summary, summary["failovers"], plan.kills)
    return summary
