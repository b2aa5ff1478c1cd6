"""Publish invoices to the invoices topology, with confirms, mandatory and persistence.

``python -m examples.invoices.producer --count N [--bad] [--flaky]`` (from the repository
root; EAI_AMQP_URL names the broker and vhost). Invoice ``<prefix>-<n>`` is published with
that id as its message_id, so publishing the same invoices again is harmless: the worker acks
them as duplicates. ``--bad`` adds ``<prefix>-bad`` (amount_cents 0: a business error),
``--flaky`` adds ``<prefix>-flaky`` (its sender fails once: it succeeds on attempt 2).

One line per message: ``message_id=<id> status=confirmed|unroutable|nacked|failed``. Exit 0
only if every message was confirmed; 3 if any was unroutable; 1 otherwise.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from amqp_lab.cli.common import (
    EXIT_FAILED,
    EXIT_OK,
    EXIT_UNROUTABLE,
    run,
    settings_from_env,
)
from amqp_lab.cli.parser import CommandParser
from amqp_lab.errors import AmqpLabError, MessageNacked, MessageUnroutable
from amqp_lab.message import message_for
from amqp_lab.publishing.blocking import Publisher
from amqp_lab.topology import load_topology

__all__ = ["TOPOLOGY", "invoices", "main"]

TOPOLOGY = Path(__file__).resolve().parents[2] / "topology" / "invoices.json"


def invoices(
    count: int, *, bad: bool = False, flaky: bool = False, prefix: str = "inv"
) -> list[dict[str, Any]]:
    """The invoice bodies to publish: ``count`` good ones, then the bad and the flaky one."""
    bodies: list[dict[str, Any]] = [
        {"invoice_id": f"{prefix}-{n}", "customer": f"customer-{n}", "amount_cents": 100 * n}
        for n in range(1, count + 1)
    ]
    if bad:
        bodies.append({"invoice_id": f"{prefix}-bad", "customer": "nobody", "amount_cents": 0})
    if flaky:
        bodies.append(
            {
                "invoice_id": f"{prefix}-flaky",
                "customer": "flaky",
                "amount_cents": 4200,
                "flaky": True,
            }
        )
    return bodies


def main(argv: list[str] | None = None) -> int:
    """The producer command (exit code returned)."""
    parser = CommandParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=3, help="good invoices to publish")
    parser.add_argument("--bad", action="store_true", help="add an invalid invoice")
    parser.add_argument("--flaky", action="store_true", help="add one whose sender fails once")
    parser.add_argument("--prefix", default="inv", help="invoice ids are PREFIX-1, PREFIX-2...")
    parser.add_argument(
        "--topology",
        default=str(TOPOLOGY),
        metavar="FILE",
        help="definitions JSON naming the exchange and routing key (default: the example's)",
    )
    args = parser.parse_args(argv)
    if args.count < 0:
        parser.error("--count must be >= 0")
    names = load_topology(args.topology).names
    settings = settings_from_env("examples.invoices producer")
    unroutable = failed = 0
    with Publisher(settings) as publisher:
        for body in invoices(args.count, bad=args.bad, flaky=args.flaky, prefix=args.prefix):
            message = message_for(names, body, message_id=body["invoice_id"])
            status, detail = "confirmed", ""
            try:
                publisher.publish(message)
            except MessageUnroutable as e:
                status, detail = "unroutable", str(e)
                unroutable += 1
            except MessageNacked as e:
                status, detail = "nacked", str(e)
                failed += 1
            except AmqpLabError as e:  # the connection failed for good: the rest would too
                print(f"message_id={message.message_id} status=failed error={str(e)!r}")
                return EXIT_FAILED
            line = f"message_id={message.message_id} status={status}"
            print(line + (f" error={detail!r}" if detail else ""), flush=True)
    if unroutable:
        return EXIT_UNROUTABLE
    return EXIT_FAILED if failed else EXIT_OK


if __name__ == "__main__":
    run(main)
