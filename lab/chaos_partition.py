"""The partition crash test (scripts/chaos.py --cluster --partition): while the publisher
publishes confirmed messages to the quorum queue q:tasks and the workers consume them with
dedup, cut one node off the others (``docker network disconnect``) or freeze it (``docker
pause``), as lab.partitions plans; heal it; wait until the cluster is whole and the service
resumed; then drain and check that every confirmed message_id was applied exactly once.

What happens at each fault and why each lasts as long as it does: docs/cluster.md#partitions.
The management API is asked only while the cluster is whole (before a fault, after healing):
during one it may hang, since it asks every node. Detection times come from the nodes' logs.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any

from amqp_lab.cli.progress import Progress
from amqp_lab.dedup import ManagedDedupStore
from amqp_lab.dlq.ops import browse, depth
from amqp_lab.settings import BrokerSettings
from lab.chaos import OutputTally, read_ledger, summarize
from lab.chaos_cluster import ClusterChaosPlan
from lab.chaos_pool import WorkerPool, connection_name
from lab.chaos_publisher import GatedPublisher
from lab.chaos_worker import NAMES, QUEUE
from lab.cluster import Cluster, ClusterError, ClusterNode
from lab.cluster_watch import declared_down_at, read_timers
from lab.failover import confirmed_ids, first_confirm, resume_time
from lab.leader_kills import connections_by_node, portions
from lab.partitions import (
    CONSUMER,
    PARTITION,
    PUBLISHER,
    REFUSALS,
    Fault,
    FaultPlan,
    Step,
    Timers,
    fault_reports,
    partition_holds,
    plan,
)

POLL = 0.1  # seconds between looks at the workers' output and the publisher


def plan_faults(
    cluster: Cluster, heartbeat: float, partitions: int, pauses: int, confirm_timeout: float
) -> FaultPlan:
    """The run's faults, planned for the timers the cluster's first node runs with and the
    clients' ``heartbeat`` and ``confirm_timeout`` (seconds). ClusterError when the cluster
    network is not internal (a cut would drop the node's clients too: lab.cluster)."""
    if not cluster.client_paths_survive_a_cut():
        raise ClusterError(
            f"--partition: the network of cluster {cluster.name} is not internal (an older "
            "amqp-lab made it), so a cut would drop the node's clients too; recreate it: "
            "scripts/cluster.py stop, then start --partition-timers"
        )
    ticktime, disconnected_ms = read_timers(cluster, cluster.nodes[0])
    timers = Timers(ticktime, disconnected_ms / 1000, heartbeat, confirm_timeout)
    return FaultPlan(timers, tuple(plan(partitions, pauses, timers)))


class PartitionChaos:
    """Makes the faults of ``steps`` on ``cluster`` while ``publisher`` and ``pool`` work on
    ``settings``' vhost; ``tally`` reads the workers' output. Each wait is bounded by
    ``timeout`` seconds (logged when it gives up: the invariant then fails on what is
    missing). ``progress``: a terminal's progress line, silent in a pipe."""

    def __init__(
        self,
        cluster: Cluster,
        settings: BrokerSettings,
        publisher: GatedPublisher,
        pool: WorkerPool,
        tally: OutputTally,
        log: Callable[[str], None],
        steps: tuple[Step, ...],
        timeout: float = 120,
        progress: Progress | None = None,
    ) -> None:
        self.cluster, self.settings, self.publisher = cluster, settings, publisher
        self.pool, self.tally, self.log, self.steps = pool, tally, log, steps
        self.timeout, self.progress = timeout, progress
        self.faults: list[Fault] = []
        self.missing = ""  # what was not whole yet at the last look (for the log)
        self.leader = ""  # q:tasks' leader at the last look

    def run(self) -> list[Fault]:
        """Publish, consume, fault and heal; returns once every message was handed over and
        publishing ended (the caller drains). A third of each portion goes before its fault,
        the rest during it, spread over the fault's hold."""
        sizes = portions(self.publisher.count, len(self.steps))
        self.pool.start_all()
        self.publisher.allow(1)
        self._wait("the workers consume", lambda: self.tally.update(self.pool.outputs) > 0)
        end = 0
        for i, (step, size) in enumerate(zip(self.steps, sizes, strict=False)):
            before, end = end, end + size
            if self.faults:
                self.faults[-1].refused_after = self.publisher.refused()
            leader = self._leader()  # once the cluster is whole
            node, carried = self._target(step.role, leader)
            head = max(1, size // 3)
            self.publisher.allow(head - 1 if i == 0 else head)
            self._wait("publishing and consuming", partial(self._mid, before + head))
            self.faults.append(self._fault(step, node, leader, carried, end))
        self.publisher.allow(sizes[-1])
        self._wait("publishing ended", lambda: not self.publisher.is_alive(), self.timeout * 3)
        if self.faults:
            self.faults[-1].refused_after = self.publisher.refused()
        return self.faults

    def _mid(self, handed: int) -> bool:
        self.tally.update(self.pool.outputs)
        return self.publisher.handed >= handed and bool(self.pool.busy(within=0.5))

    def _fault(
        self, step: Step, node: ClusterNode, leader: str, carried: list[str], end: int
    ) -> Fault:
        """Make ``step``'s fault on ``node`` (which carried the connections named
        ``carried``) while the portion ending at message ``end`` is handed over."""
        fault = Fault(
            step,
            node.nodename,
            time.time(),
            leader,
            self.publisher.reconnects,
            self.publisher.refused(),
            publisher_on_node=self._publisher_node() == node,
            workers_on_node=sum(1 for n in carried if n != connection_name("publisher")),
            publishing=self.publisher.handed < end,
            consuming=bool(self.pool.busy(within=0.5)),
        )
        began = time.monotonic()
        (self.cluster.disconnect if step.kind == PARTITION else self.cluster.pause)(node)
        self.log(
            f"{step.kind.upper()} {node.nodename} for {step.hold:.1f} s ({step.role}; "
            f"{'the leader, ' if leader == node.nodename else ''}{fault.workers_on_node} "
            f"worker connection(s){', the publisher' if fault.publisher_on_node else ''}), "
            f"{self.publisher.handed} messages handed over by then"
            + ("" if fault.consuming else "; no worker settled a delivery in the last 0.5 s")
        )
        self._hold(step.hold, end)
        (self.cluster.reconnect if step.kind == PARTITION else self.cluster.unpause)(node)
        healed = time.monotonic()
        fault.held_s = healed - began
        if self._wait(f"{node.nodename} is back and q:tasks whole", self._whole):
            fault.rejoined_s = round(time.monotonic() - healed, 1)
        self._wait("confirms and deliveries resume", lambda: self._resumed(fault.at))
        observer = next(n for n in self.cluster.nodes if n != node)
        seen = declared_down_at(self.cluster, observer, node.nodename, fault.at)
        fault.detected_s = None if seen is None else round(seen - fault.at, 1)
        fault.leader_after = self.leader
        self.log(
            f"healed {node.nodename}: {observer.nodename} declared it down "
            f"{'never' if seen is None else f'after {fault.detected_s} s'}; whole again "
            f"{fault.rejoined_s} s after healing; leader {fault.leader_after}; refused so far "
            f"{self.publisher.refused()}"
        )
        return fault

    def _hold(self, seconds: float, end: int) -> None:
        """Keep the fault ``seconds`` while handing over the portion's rest evenly."""
        start, first = time.monotonic(), self.publisher.allowed
        while (elapsed := time.monotonic() - start) < seconds:
            due = first + math.ceil((end - first) * elapsed / seconds)
            if due > self.publisher.allowed:
                self.publisher.allow(due - self.publisher.allowed)
            self._tick(f"the fault's {seconds:.0f} s")
            time.sleep(POLL)
        self.publisher.allow(max(0, end - self.publisher.allowed))

    def _leader(self) -> str:
        """The node name of q:tasks' leader, as its Raft members report it."""
        if not self._wait(f"{QUEUE} has a leader", self._whole):
            raise ClusterError(f"queue {QUEUE!r} has no leader: cannot choose the nodes")
        return self.leader

    def _publisher_node(self) -> ClusterNode | None:
        address = self.publisher.address
        return next(
            (n for n in self.cluster.nodes if address and n.amqp_port == address.port), None
        )

    def _target(self, role: str, leader: str) -> tuple[ClusterNode, list[str]]:
        """The node that has ``role`` now and the connections it carries (client-provided
        names, as the management API lists them once they are 1-5 s old): the leader's node;
        the publisher's (waiting while it reconnects); for a consumer, the node of a worker
        other than the leader's, or else the leader's if a worker is there, or else another."""
        everyone = {connection_name(w) for w in ["publisher", *self.pool.names]}
        on: dict[str, str] = {}

        def listed() -> bool:
            on.update(connections_by_node(self.settings))
            return everyone <= set(on)

        self._wait("every connection shows", listed, 8)
        self.log(
            "connections: "
            + ", ".join(f"{c.removeprefix(connection_name(''))} {n}" for c, n in sorted(on.items()))
        )
        node = self.cluster.node_for(leader)
        others = [n for n in self.cluster.nodes if n != node]
        if role == PUBLISHER and self._wait("the publisher is connected", self._publisher_node):
            node = self._publisher_node() or node
        elif role == CONSUMER:
            workers = {on.get(connection_name(w)) for w in self.pool.names}
            node = next((n for n in [*others, node] if n.nodename in workers), others[0])
        return node, [c for c, n in on.items() if n == node.nodename]

    def _whole(self) -> bool:
        """Every node runs and sees the others (management API), and q:tasks has one leader
        and every other member follows it (``rabbitmq-queues quorum_status``: the Raft
        members' own word; the management API's ``online`` list lagged it by up to 83 s
        after a partition healed). Sets ``leader``; ``missing`` says what was not so at the
        last look."""
        try:
            members = self.cluster.quorum_status(self.settings.vhost, QUEUE)
        except ClusterError as e:
            members, self.missing = [], str(e)
        states = {str(m.get("Node Name")): str(m.get("Raft State")) for m in members}
        leaders = [n for n, state in states.items() if state == "leader"]
        self.leader = leaders[0] if len(leaders) == 1 else ""
        seen = {n.nodename: len(self.cluster.members_seen(n)) for n in self.cluster.nodes}
        self.missing = f"{QUEUE} members {states}; members each node sees {seen}"
        following = set(states.values()) <= {"leader", "follower"} and len(states) == len(seen)
        return bool(self.leader) and following and set(seen.values()) == {len(seen)}

    def _resumed(self, at: float) -> bool:
        self.tally.update(self.pool.outputs)
        confirmed = first_confirm(self.publisher.snapshot(), at) is not None
        return confirmed and resume_time(at, self.tally.settled) is not None

    def _tick(self, what: str) -> None:
        self.tally.update(self.pool.outputs)
        if self.progress is not None:
            note = f"deliveries {self.tally.counts['deliveries']}, faults {len(self.faults)}"
            self.progress.update(self.publisher.handed, f"{note}: {what}")
        for line in self.pool.restart_exited():
            self.log(line)

    def _wait(self, what: str, done: Callable[[], object], timeout: float | None = None) -> bool:
        """Poll ``done`` until it is true; False, logged, after ``timeout`` seconds."""
        start = time.monotonic()
        deadline, report = start + (self.timeout if timeout is None else timeout), start + 15
        while not done():
            self._tick(f"waiting for {what}")
            if time.monotonic() > report:
                report += 15
                self.log(
                    f"still waiting until {what} after {report - start - 15:.0f} s ({self.missing})"
                )
            if time.monotonic() > deadline:
                self.log(f"gave up waiting until {what} ({self.missing})")
                return False
            time.sleep(POLL)
        return True


def run_partition_chaos(
    cluster: Cluster,
    settings: BrokerSettings,
    store: ManagedDedupStore,
    plan: ClusterChaosPlan,
    faults_planned: FaultPlan,
    worker_command: list[str],
    run_id: str,
    workdir: Path,
    log: Callable[[str], None],
    progress: Progress | None = None,
) -> dict[str, Any]:
    """The whole partition run on ``settings``' vhost (quorum topology applied, q:tasks
    empty): workers (``worker_command`` + ``--worker-process NAME``), the planned faults,
    the drain (stop file in ``workdir``) and the summary: lab.chaos' counts, the run's own,
    one dict per fault under ``events`` (lab.partitions.fault_reports) and ``invariant_holds``
    (lab.partitions.partition_holds). Every node is healed (reconnected, unpaused) on the way
    out, whatever happened."""
    started = time.monotonic()
    timers, steps = faults_planned.timers, faults_planned.steps
    tally = OutputTally()
    pool = WorkerPool(plan.workers, worker_command, workdir)
    publisher = GatedPublisher(
        replace(settings, connection_name=connection_name("publisher")),
        run_id,
        plan.messages,
        plan.dup_every,
        plan.rate,
        plan.window,
        timers.confirm_timeout,
    )
    chaos = PartitionChaos(cluster, settings, publisher, pool, tally, log, steps, progress=progress)
    try:
        publisher.start()
        faults = chaos.run()
        log("draining")
        left = pool.drain(workdir / "stop", lambda: depth(settings, QUEUE))
    finally:
        healed = cluster.heal()
        if healed:
            log(f"healed {', '.join(healed)} on the way out")
        pool.kill_all()
        publisher.join(5)
    tally.update(pool.outputs)
    records = publisher.records
    dlq_ids = [e.message_id for e in browse(settings, NAMES.dlq) if e.message_id]
    summary: dict[str, Any] = summarize(
        confirmed_ids(records), read_ledger(store, run_id), dlq_ids, tally.counts["redelivered"]
    )
    refused = publisher.refused()
    summary.update(
        mode="partition",
        workers=plan.workers,
        partitions=sum(1 for f in faults if f.step.kind == PARTITION),
        pauses=sum(1 for f in faults if f.step.kind != PARTITION),
        timers=timers.as_dict(),
        publishes=len(records),
        publish_failed=sum(1 for r in records if r.done_at is not None and not r.confirmed),
        publisher_reconnects=publisher.reconnects,
        confirms_refused={k: refused[k] for k in REFUSALS},
        publisher_error=None if publisher.error is None else str(publisher.error),
        duplicates_skipped=tally.counts["outcome:duplicate"],
        deliveries=tally.counts["deliveries"],
        unexpected_worker_exits=pool.unexpected_exits,
        left_in_queue=left,
        seconds=round(time.monotonic() - started, 1),
        events=fault_reports(faults, records, tally.settled),
    )
    if publisher.is_alive():
        summary["publisher_error"] = "still publishing at the end of the run"
    summary["invariant_holds"] = partition_holds(summary, summary["events"], len(steps))
    return summary
