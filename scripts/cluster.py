#!/usr/bin/env python3
"""Run a three-node RabbitMQ cluster on this machine, in Docker containers (lab.cluster).

    python scripts/cluster.py start [--partition-timers]|stop|status|env|heal
    python scripts/cluster.py kill NODE | restart NODE      (NODE: rmq2, 2 or rabbit@rmq2)
    python scripts/cluster.py disconnect NODE | reconnect NODE | pause NODE | unpause NODE

``start`` creates the network and containers, joins nodes 2..N to node 1 and waits until all
run in one cluster (already running: says so); ``--partition-timers`` gives new nodes the
partition chaos's shorter failure detection (lab/partition_timers.conf). ``kill`` is SIGKILL
(docker kill); ``restart`` starts a killed node again and waits until it is back in the
cluster; ``disconnect`` cuts a node off the cluster network (its clients still reach it) and
``reconnect`` undoes it; ``pause`` freezes a node (docker pause) and ``unpause`` thaws it;
``heal`` reconnects and thaws every node; ``stop`` removes the containers, their volumes and
the network. ``env`` prints export lines for EAI_AMQP_URL and EAI_MGMT_URL in the
comma-separated list form (use: eval "$(python scripts/cluster.py env)").
"""

from __future__ import annotations

import time
from pathlib import Path

from _cli import EXIT_FAILED, EXIT_OK, run

from amqp_lab.cli.parser import CommandParser
from lab.cluster import DEFAULT_IMAGE, DEFAULT_NAME, PARTITION_TIMERS, Cluster

NODE_COMMANDS = ("kill", "restart", "disconnect", "reconnect", "pause", "unpause")


def main() -> int:
    parser = CommandParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "command", choices=["start", "stop", "status", "env", "heal", *NODE_COMMANDS]
    )
    parser.add_argument(
        "node", nargs="?", help=f"for {', '.join(NODE_COMMANDS)}: rmqN, N, rabbit@rmqN"
    )
    parser.add_argument("--size", type=int, default=3, help="number of nodes (default 3)")
    parser.add_argument("--image", default=DEFAULT_IMAGE, help=f"default {DEFAULT_IMAGE}")
    parser.add_argument("--name", default=DEFAULT_NAME, help="Docker network / container prefix")
    parser.add_argument(
        "--amqp-port", type=int, default=5701, help="node 1's AMQP port; node N gets +N-1"
    )
    parser.add_argument(
        "--management-port", type=int, default=15701, help="node 1's management port; +N-1"
    )
    parser.add_argument("--vhost", default="/", help="the vhost in the env URLs (default /)")
    parser.add_argument("--timeout", type=float, default=240, help="seconds to wait (default 240)")
    parser.add_argument("--config", type=Path, default=None, help="rabbitmq.conf to mount")
    parser.add_argument(
        "--partition-timers", action="store_true", help="start: net_ticktime 10 s and more"
    )
    args = parser.parse_args()
    if (args.command in NODE_COMMANDS) != (args.node is not None):
        parser.error(
            f"{args.command} takes a NODE"
            if args.node is None
            else f"NODE only for {', '.join(NODE_COMMANDS)}"
        )
    cluster = Cluster(
        size=args.size,
        image=args.image,
        amqp_port=args.amqp_port,
        management_port=args.management_port,
        name=args.name,
        **({"config_file": args.config.resolve()} if args.config else {}),
        extra_config=PARTITION_TIMERS if args.partition_timers else None,
    )
    if args.command == "env":
        print(f"export EAI_AMQP_URL='{','.join(cluster.amqp_urls(args.vhost))}'")
        print(f"export EAI_MGMT_URL='{','.join(cluster.management_urls())}'")
        return EXIT_OK
    if args.command == "status":
        ok = True
        for s in cluster.status():
            n = s.node
            members = ",".join(s.members) if s.members else "-"
            ok = ok and s.state == "running" and len(s.members) == len(cluster.nodes)
            print(
                f"{n.nodename} {s.state} (amqp 127.0.0.1:{n.amqp_port}, management "
                f"127.0.0.1:{n.management_port}) members seen: {members}"
            )
        return EXIT_OK if ok else EXIT_FAILED
    started = time.monotonic()
    if args.command == "start":
        if not cluster.start(timeout=args.timeout):
            print(f"cluster {args.name} is already running ({len(cluster.nodes)} nodes)")
            return EXIT_OK
    elif args.command == "stop":
        cluster.stop()
    elif args.command == "heal":
        healed = cluster.heal()
        print(f"healed {', '.join(healed)}" if healed else "every node was connected and running")
        return EXIT_OK
    elif args.command in ("kill", "disconnect", "pause"):
        getattr(cluster, args.command)(args.node)
    elif args.command in ("reconnect", "unpause") and not getattr(cluster, args.command)(args.node):
        print(f"node {cluster.node(args.node).nodename}: nothing to {args.command}")
        return EXIT_OK
    elif args.command == "restart" and not cluster.restart(args.node, timeout=args.timeout):
        print(f"node {cluster.node(args.node).nodename} is already running")
        return EXIT_OK
    what = f"node {cluster.node(args.node).nodename}" if args.node else f"cluster {args.name}"
    print(f"{what}: {args.command} done in {time.monotonic() - started:.1f}s")
    return EXIT_OK


if __name__ == "__main__":
    run(main)
