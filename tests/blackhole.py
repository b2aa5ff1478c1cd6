"""A network that is gone, for a test: every TCP packet to and from a port on 127.0.0.1 dropped
by iptables, so the peer neither answers nor resets - what a cut cable, a host powered off or a
failover that moved an address looks like to a client. A userspace proxy cannot do this: its
kernel still acknowledges what is sent and answers keepalive probes.

Only a port of the test's own (a :class:`lab.pg_node.PgNode`): never a shared service's. Needs
root and iptables (:func:`unavailable` says why not)."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["blackhole", "unavailable"]

_COMMENT = "amqp-lab-test-blackhole"


def _rules(port: int) -> list[list[str]]:
    tagged = ["-m", "comment", "--comment", _COMMENT]
    return [
        ["INPUT", "-i", "lo", "-p", "tcp", direction, str(port), "-j", "DROP", *tagged]
        for direction in ("--dport", "--sport")
    ]


def unavailable() -> str | None:
    """Why :func:`blackhole` cannot run here (not root, no iptables, iptables refused), or
    None."""
    if os.geteuid() != 0:
        return "dropping packets with iptables needs root"
    if shutil.which("iptables") is None:
        return "no iptables"
    probe = subprocess.run(["iptables", "-w", "10", "-S", "INPUT"], capture_output=True, text=True)
    if probe.returncode != 0:
        return f"iptables cannot be used: {probe.stderr.strip()[:200]}"
    return None


@contextmanager
def blackhole(port: int) -> Iterator[None]:
    """Drop every packet to and from ``port`` on the loopback interface until the block ends
    (the rules are removed whatever happens)."""
    added: list[list[str]] = []
    try:
        for rule in _rules(port):
            subprocess.run(["iptables", "-w", "10", "-I", *rule], check=True, capture_output=True)
            added.append(rule)
        yield
    finally:
        for rule in added:
            subprocess.run(["iptables", "-w", "10", "-D", *rule], capture_output=True)
