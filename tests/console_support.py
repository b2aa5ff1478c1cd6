"""A DLQ with three error groups for the console's tests: DLQ records built and published as
the consumer does (build_record + record_message, with confirms)."""

from __future__ import annotations

import socket
import time
from dataclasses import dataclass
from decimal import Decimal

from amqp_lab.dlq.record import build_record, record_message, utc_iso
from amqp_lab.errors import BusinessError
from amqp_lab.message import encode_json
from amqp_lab.publishing.blocking import Publisher
from amqp_lab.settings import BrokerSettings
from tests.support import NAMES

HOSTILE = "<script>alert('dlq')</script>"


@dataclass(frozen=True)
class Failure:
    """One DLQ record to publish: its message_id, the error, how it is classified."""

    message_id: str
    error: BaseException
    classification: str


def price_per_unit(total: int, units: int) -> float:
    return total / units


def _raised_zero_division() -> ZeroDivisionError:
    try:
        price_per_unit(10, 0)
    except ZeroDivisionError as e:
        return e
    raise AssertionError("unreachable")


CUSTOMERS = [
    Failure("order-1001", BusinessError("order 1001 has no customer 'c-17'"), "business"),
    Failure("order-1002", BusinessError("order 1002 has no customer 'c-23'"), "business"),
    Failure("order-1003", BusinessError("order 1003 has no customer 'c-5'"), "business"),
]
TIMEOUTS = [
    Failure(
        "stock-2001",
        TimeoutError("inventory did not answer within 30 s (request 7f3a9c2e)"),
        "transient",
    ),
    Failure(
        "stock-2002",
        TimeoutError("inventory did not answer within 45 s (request 0b41d9aa)"),
        "transient",
    ),
]
DIVISION = [Failure("price-3001", _raised_zero_division(), "unknown")]
THREE_GROUPS = [*CUSTOMERS, *TIMEOUTS, *DIVISION]
"""3 + 2 + 1 records of three error types, with varying numbers and ids in the messages."""


def fill_dlq(settings: BrokerSettings, failures: list[Failure], base: float | None = None) -> None:
    """Publish a DLQ record per failure (one minute apart, the last a minute ago), with a
    payload and headers holding markup that a page must escape."""
    start = (base if base is not None else time.time()) - 60 * (len(failures) + 1)
    with Publisher(settings) as publisher:
        for seq, failure in enumerate(failures):
            record = build_record(
                body=encode_json({"id": failure.message_id, "note": HOSTILE, "seq": seq}),
                message_id=failure.message_id,
                exchange=NAMES.exchange,
                routing_key=NAMES.routing_key,
                queue=NAMES.queue,
                properties={"content_type": "application/json", "priority": 3},
                headers={"x-request-id": HOSTILE, "amount": Decimal("12.50"), "attempts": 1},
                error=failure.error,
                classification=failure.classification,
                attempts=3 if failure.classification == "transient" else 1,
                first_seen_at=utc_iso(start + 60 * seq - 30),
                failed_at=start + 60 * seq,
            )
            publisher.publish(record_message(record, NAMES.dead_letter_exchange, NAMES.routing_key))


def free_port() -> int:
    """A TCP port nothing listens on now (on 127.0.0.1)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
