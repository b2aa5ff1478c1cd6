#!/usr/bin/env python3
"""Reading throughput of the audit stream reader (amqp_lab.audit.StreamReader): publish N
entries into a stream of its own in EAI_AMQP_URL's vhost, read them from "first" with offset
tracking on (a JSON store write every --store-every entries), print msgs/s, delete the stream.

    python benchmarks/audit_read.py [--messages 10000] [--prefetch 500] [--store-every 500]
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import pika

from amqp_lab.audit import OffsetStore, StreamEntry, StreamReader
from amqp_lab.cli.parser import CommandParser
from amqp_lab.connection import open_channel
from amqp_lab.settings import BrokerSettings


def main() -> int:
    parser = CommandParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=10_000)
    parser.add_argument("--prefetch", type=int, default=500)
    parser.add_argument("--store-every", type=int, default=500)
    args = parser.parse_args()
    settings = BrokerSettings(os.environ["EAI_AMQP_URL"], os.environ.get("EAI_MGMT_URL"))
    stream = f"bench:audit:{os.getpid()}"
    body = b'{"task": "bench", "pad": "' + b"x" * 200 + b'"}'
    with open_channel(settings) as channel:
        channel.queue_declare(stream, durable=True, arguments={"x-queue-type": "stream"})
        channel.confirm_delivery()
        for n in range(args.messages):  # confirmed one by one; the publish side is not timed
            channel.basic_publish("", stream, body, pika.BasicProperties(message_id=f"b-{n}"))
    try:
        with tempfile.TemporaryDirectory() as tmp:
            reader = StreamReader(
                settings,
                stream,
                prefetch=args.prefetch,
                store=OffsetStore(Path(tmp) / "offsets.json"),
                name="bench",
                store_every=args.store_every,
            )
            seen: list[int] = []

            def on_entry(entry: StreamEntry) -> None:
                seen.append(entry.offset)

            began = time.perf_counter()
            report = reader.read(on_entry, "first", limit=args.messages, idle_timeout=10)
            elapsed = time.perf_counter() - began
        print(
            f"read {report.read} entries in {elapsed:.2f}s: {report.read / elapsed:,.0f} msgs/s "
            f"(prefetch {args.prefetch}, offset stored every {args.store_every}, "
            f"{len(report.stored)} stores; includes connect)"
        )
    finally:
        with open_channel(settings) as channel:
            channel.queue_delete(stream)
    return 0


if __name__ == "__main__":
    sys.exit(main())
