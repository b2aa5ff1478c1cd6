"""The leader kills of the cluster crash test (lab.chaos_cluster runs them): F times, SIGKILL
the node that hosts the quorum queue q:tasks' leader while the publisher publishes and the
workers consume, wait for a new leader and for the consumers to resume, restart the node and
wait until its replica is back in the queue.

The cluster is driven through :class:`ClusterControl`, which :class:`lab.cluster.Cluster`
satisfies as it is (node names are Erlang node names, ``rabbit@rmq1``). The moment of each kill
is the Docker engine's ``kill`` event for the node's container (:func:`kill_event_time`, an
adapter beside lab.cluster): the docker kill API call returns up to ~100 ms after the signal on
a busy machine, and before it the old leader still confirms and delivers.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Protocol

from amqp_lab.cli.progress import Progress
from amqp_lab.errors import AmqpLabError
from amqp_lab.management import ManagementClient
from amqp_lab.settings import BrokerSettings
from lab.chaos import OutputTally
from lab.chaos_pool import WorkerPool, connection_name
from lab.chaos_publisher import GatedPublisher
from lab.cluster_nodes import ClusterError, ClusterNode
from lab.failover import Kill, resume_time

POLL = 0.1  # seconds between looks at the leader, the workers' output, the queue's members


class ClusterControl(Protocol):
    """What the cluster crash test needs from a cluster (lab.cluster.Cluster has it)."""

    def node_for(self, nodename: str) -> ClusterNode: ...

    def queue_leader(self, vhost: str, queue: str) -> str | None: ...

    def queue_info(self, vhost: str, queue: str) -> dict[str, Any] | None: ...

    def kill(self, node: str) -> None: ...

    def restart(self, node: str) -> object: ...


@dataclass
class Failover:
    """One leader kill as it happened: the pure part (``kill``) and what the orchestrator saw:
    ``leader_after`` (the new leader; None: none within the wait), ``leader_seen_s`` (kill
    until the management API named it, polled every 0.1 s: an upper bound of the election,
    since the API's ``leader`` field follows the queue's metadata, which lags by up to a few
    seconds), ``restart_s`` (restart until the node's replica was online in the queue again),
    ``handed_over`` (messages handed to the publisher by the kill), ``publishing`` (its
    portion was not all handed over yet), ``consuming`` (a worker settled a delivery in the
    half second before) and which connections the killed node carried (as the management API
    listed them: a new connection shows after 1-5 s)."""

    kill: Kill
    handed_over: int = 0
    publishing: bool = False
    consuming: bool = False
    leader_after: str | None = None
    leader_seen_s: float | None = None
    restart_s: float | None = None
    publisher_on_node: bool | None = None
    workers_on_node: list[str] = field(default_factory=list)

    def facts(self) -> dict[str, Any]:
        return {
            "handed_over": self.handed_over,
            "publishing": self.publishing,
            "consuming": self.consuming,
            "leader_after": self.leader_after,
            "leader_seen_s": self.leader_seen_s,
            "restart_s": self.restart_s,
            "publisher_on_node": self.publisher_on_node,
            "workers_on_node": len(self.workers_on_node),
        }


def kill_event_time(container: str, since: float) -> float | None:
    """Epoch seconds of the Docker engine's first ``kill`` event for ``container`` at or after
    ``since`` (when the engine sent the signal: GET /events, ``timeNano``); None when the
    engine does not answer or shows none."""
    import docker

    try:
        client = docker.from_env(timeout=10)
        try:
            events = client.events(
                since=int(since) - 1,
                until=int(time.time()) + 1,
                filters={"container": container, "event": "kill"},
                decode=True,
            )
            times = [int(e["timeNano"]) / 1e9 for e in events]
        finally:
            client.close()
    except (docker.errors.DockerException, KeyError, ValueError):
        return None
    after = [t for t in times if t >= since - 0.01]
    return min(after) if after else None


LATE_KILLS = 3  # times a kill may wait for more messages when its portion went by before it


def portions(messages: int, kills: int) -> list[int]:
    """``messages`` split into ``kills + 1`` portions (one before each kill, one after the
    last), the remainder in the last."""
    size = messages // (kills + 1)
    return [size] * kills + [messages - size * kills]


def connections_by_node(settings: BrokerSettings) -> dict[str, str]:
    """Client-provided connection name -> the node that carries it, in ``settings``' vhost
    (management API; a connection shows after its first statistics, 1-5 s). Empty when the
    management API does not answer."""
    try:
        with ManagementClient(settings, timeout=3) as api:
            found = api.connections(settings.vhost)
    except AmqpLabError:
        return {}
    return {
        str((c.get("client_properties") or {}).get("connection_name")): str(c.get("node"))
        for c in found
    }


class ClusterChaos:
    """Kills ``kills`` leaders of ``queue`` while ``publisher`` and ``pool`` work; ``tally``
    reads the workers' output. Waits are bounded by ``timeout`` seconds each. ``progress`` (a
    terminal's, silent in a pipe) shows the messages handed over, deliveries, kills, and what
    the run waits for."""

    def __init__(
        self,
        cluster: ClusterControl,
        settings: BrokerSettings,
        queue: str,
        publisher: GatedPublisher,
        pool: WorkerPool,
        tally: OutputTally,
        log: Callable[[str], None],
        timeout: float = 90,
        progress: Progress | None = None,
    ) -> None:
        self.cluster, self.settings, self.queue = cluster, settings, queue
        self.publisher, self.pool, self.tally, self.log = publisher, pool, tally, log
        self.timeout, self.progress = timeout, progress
        self.failovers: list[Failover] = []

    def run(self, kills: int) -> list[Failover]:
        """Publish, consume and kill; returns once the last portion has been handed over and
        publishing ended (the caller drains). One message goes first, so the first kill finds
        the workers already consuming."""
        plan = portions(self.publisher.count, kills)
        self.pool.start_all()
        self.publisher.allow(1)
        self._wait("the workers consume", lambda: self.tally.update(self.pool.outputs) > 0)
        end = 0
        for i, size in enumerate(plan[:-1]):
            # what a held-back kill publishes first comes out of the last portion, which keeps
            # half of its messages at least
            extra, before = max(1, size // 4), end
            allowance = size - 1 if i == 0 else size
            for late in range(LATE_KILLS + 1):
                # the slow lookups (management API) before the messages go, so that once a
                # third of them have been handed over only one stands between the kill and
                # the rest
                leader = self._leader()
                on_node = self._connections_on(leader)
                self.publisher.allow(allowance)
                end = self.publisher.allowed
                self._wait("publishing and consuming", partial(self._mid, before, end - before))
                spare = self.publisher.count - self.publisher.allowed - sum(plan[i + 1 : -1])
                may_defer = late < LATE_KILLS and spare - extra >= plan[-1] // 2
                failover = self._failover(end, leader, on_node, may_defer)
                if failover is not None:
                    break
                allowance, before = extra, self.publisher.handed
            assert failover is not None
            self.failovers.append(failover)
        self.publisher.allow(plan[-1])
        self._wait("publishing ended", lambda: not self.publisher.is_alive(), self.timeout * 3)
        return self.failovers

    def _mid(self, before: int, size: int) -> bool:
        """A third of the portion handed over, and a worker settled a delivery just now."""
        self.tally.update(self.pool.outputs)
        third = self.publisher.handed - before >= max(1, size // 3)
        return third and bool(self.pool.busy(within=0.5))

    def _connections_on(self, node: str) -> list[str]:
        """The client-provided names of the vhost's connections that ``node`` carries."""
        return [n for n, on in connections_by_node(self.settings).items() if on == node]

    def _failover(
        self, end: int, leader: str, on_node: list[str], may_defer: bool = False
    ) -> Failover | None:
        """Kill ``leader``'s node (``on_node``: the connections it carries) while the portion
        ending at message ``end`` is published, once the management API confirms it still
        leads. With ``may_defer``: None, and no kill, when by then the portion has been
        handed over whole or no worker settled a delivery in the last 0.5 s (a kill would find
        nothing in flight, and nothing would show the consumers resume: CI on a loaded
        machine waited 90 s for that)."""
        confirmed_leader = self._leader()  # right before the kill: still the same node?
        consuming = bool(self.pool.busy(within=0.5))
        if may_defer and not (consuming and self.publisher.handed < end):
            self.log(
                f"late for the kill: {self.publisher.handed} of {end} messages handed over, "
                f"{'a worker' if consuming else 'no worker'} busy; publishing more first"
            )
            return None
        reconnects, handed, asked = self.publisher.reconnects, self.publisher.handed, time.time()
        self.cluster.kill(leader)
        at = kill_event_time(self.cluster.node_for(leader).container, asked)
        if at is None:
            self.log("no Docker kill event found: the kill's time is when it was asked for")
        kill = Kill(leader, confirmed_leader, at or asked, reconnects)
        f = Failover(kill, handed, handed < end, consuming)
        f.publisher_on_node = connection_name("publisher") in on_node
        f.workers_on_node = sorted(n for n in on_node if n != connection_name("publisher"))
        self.log(
            f"SIGKILL {leader} (the leader of {self.queue}; it carried "
            f"{len(f.workers_on_node)} worker connection(s)"
            f"{' and the publisher' if f.publisher_on_node else ''}), "
            f"{handed} messages handed over by then"
        )

        def new_leader() -> bool:
            found = self.cluster.queue_leader(self.settings.vhost, self.queue)
            if found is not None and found != leader:
                f.leader_after, f.leader_seen_s = found, round(time.time() - kill.at, 3)
            return f.leader_after is not None

        self._wait(f"a new leader of {self.queue}", new_leader)
        self._wait("the consumers resume", lambda: self._resumed(kill.at))
        self.log(
            f"new leader {f.leader_after} seen after {f.leader_seen_s} s; consumers resumed after "
            f"{resume_time(kill.at, self.tally.settled)} s; restarting {leader}"
        )
        began = time.monotonic()
        self.cluster.restart(leader)
        self._wait(f"{leader}'s replica is online", lambda: self._online(leader))
        f.restart_s = round(time.monotonic() - began, 1)
        self.log(f"{leader} back in the cluster and in {self.queue} after {f.restart_s} s")
        return f

    def _leader(self) -> str:
        found: list[str] = []

        def known() -> bool:
            leader = self.cluster.queue_leader(self.settings.vhost, self.queue)
            found[:] = [leader] if leader else []
            return bool(found)

        if not self._wait(f"{self.queue} has a leader", known):
            raise ClusterError(f"queue {self.queue!r} has no leader: cannot kill its node")
        return found[0]

    def _resumed(self, kill_at: float) -> bool:
        self.tally.update(self.pool.outputs)
        return resume_time(kill_at, self.tally.settled) is not None

    def _online(self, node: str) -> bool:
        info = self.cluster.queue_info(self.settings.vhost, self.queue) or {}
        return node in (info.get("online") or [])

    def _wait(self, what: str, done: Callable[[], bool], timeout: float | None = None) -> bool:
        """Poll ``done`` (restarting workers that exited) until it is true; False, logged,
        after ``timeout`` seconds (default: the chaos's ``timeout``)."""
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        while not done():
            if self.progress is not None:
                deliveries = self.tally.counts["deliveries"]
                note = f"deliveries {deliveries}, kills {len(self.failovers)}: waiting for {what}"
                self.progress.update(self.publisher.handed, note)
            for line in self.pool.restart_exited():
                self.log(line)
            if time.monotonic() > deadline:
                self.log(f"gave up waiting until {what}")
                return False
            time.sleep(POLL)
        return True
