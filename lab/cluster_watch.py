"""What the partition chaos reads from the cluster's nodes themselves (lab.chaos_partition):
their failure-detection timers, and when one node declared another down.

Both go through ``docker exec`` into a node that is reachable (never the one cut off or
frozen), so they work while the management API, which asks every node, may hang. The node's
log is our image's file (``/var/log/rabbitmq/rabbit@rmqN.log``); where a node logs to its
standard output instead (the official images), Docker's copy of it is read.
"""

from __future__ import annotations

import re
from datetime import datetime
from typing import Protocol

from lab.cluster_nodes import ClusterError, ClusterNode

_TIMERS = re.compile(r"\{(\d+),(\d+)\}")
_DOWN = re.compile(r"^(\d{4}-\d\d-\d\d[ T][\d:.]+(?:[+-]\d\d:\d\d|Z)?) .*node (\S+) down")
TIMERS_EVAL = (
    "{net_kernel:get_net_ticktime(), "
    "application:get_env(rabbit, consumer_disconnected_timeout, 60000)}."
)


class NodeAccess(Protocol):
    """What these reads need from a cluster (lab.cluster.Cluster has it)."""

    def ctl(self, node: ClusterNode, *args: str, tool: str = "rabbitmqctl") -> str: ...

    def node_log(self, node: ClusterNode, needle: str, since: float) -> str: ...


def read_timers(cluster: NodeAccess, node: ClusterNode) -> tuple[int, int]:
    """``(net_ticktime, consumer_disconnected_timeout)`` as ``node`` runs with them (seconds
    and milliseconds; rabbitmqctl eval). ClusterError when the answer cannot be read (a
    net_ticktime change in progress answers ``{ongoing_change_to, N}``)."""
    text = cluster.ctl(node, "eval", TIMERS_EVAL)
    found = _TIMERS.search(text)
    if found is None:
        raise ClusterError(f"cannot read the failure-detection timers of {node.nodename}: {text!r}")
    return int(found.group(1)), int(found.group(2))


def down_times(log_text: str, target: str) -> list[float]:
    """Epoch seconds of every ``node TARGET down`` line in a RabbitMQ log (pure): the moments
    the logging node declared ``target`` (an Erlang node name) down, net tick timeout or
    connection closed. Lines without a readable timestamp are skipped."""
    times = []
    for line in log_text.splitlines():
        found = _DOWN.match(line)
        if found is None or found.group(2).rstrip(":,") != target:
            continue
        try:
            times.append(datetime.fromisoformat(found.group(1)).timestamp())
        except ValueError:
            continue
    return times


def declared_down_at(
    cluster: NodeAccess, observer: ClusterNode, target: str, since: float
) -> float | None:
    """When ``observer`` first declared ``target`` down at or after ``since`` (epoch
    seconds), from its log; None when it did not (a fault shorter than the detection)."""
    text = cluster.node_log(observer, f"node {target} down", since)
    after = [t for t in down_times(text, target) if t >= since - 0.5]
    return min(after) if after else None
