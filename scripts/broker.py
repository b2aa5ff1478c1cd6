#!/usr/bin/env python3
"""Run a dedicated local RabbitMQ node with our rabbitmq.conf, clear of any broker on 5672.

    python scripts/broker.py start|stop|restart|kill|status|url|env [--vhost NAME]

``url`` prints the EAI_AMQP_URL for the node; ``env`` prints export lines for EAI_AMQP_URL and
EAI_MGMT_URL (use: eval "$(python scripts/broker.py env)"; ``--vhost amqp-lab-demo`` for the
demo's vhost; default ``/``). Data lives in .broker/ (git-ignored)
and survives ``restart``.
"""

from __future__ import annotations

from _cli import EXIT_FAILED, EXIT_OK, run

from amqp_lab.cli.parser import CommandParser
from amqp_lab.settings import BrokerSettings
from lab.local_broker import LocalBroker


def main() -> int:
    parser = CommandParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "command", choices=["start", "stop", "restart", "kill", "status", "url", "env"]
    )
    parser.add_argument("--vhost", default=None, help="url / env: this vhost (default /)")
    args = parser.parse_args()
    broker = LocalBroker()
    url = broker.amqp_url
    if args.vhost is not None:
        url = BrokerSettings(url).with_vhost(args.vhost).amqp_url
    if args.command == "url":
        print(url)
    elif args.command == "env":
        print(f"export EAI_AMQP_URL='{url}'")
        print(f"export EAI_MGMT_URL='{broker.management_url}'")
    elif args.command == "status":
        status = broker.status()
        print(
            f"node {broker.nodename} {status} (amqp 127.0.0.1:{broker.amqp_port}, "
            f"management 127.0.0.1:{broker.management_port})"
        )
        return EXIT_OK if status == "running" else EXIT_FAILED
    else:
        getattr(broker, args.command)()
        print(f"node {broker.nodename}: {args.command} done ({broker.status()})")
    return EXIT_OK


if __name__ == "__main__":
    run(main)
