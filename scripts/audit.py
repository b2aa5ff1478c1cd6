#!/usr/bin/env python3
"""Read the audit stream (setup_topology.py --audit stream), or show its size.

  audit.py read --from first|last|next|<offset>|<ISO timestamp> [--resume NAME [--reset]]
                [--limit N] [--idle-exit SECONDS] [--json]
  audit.py info

With --resume NAME the last processed offset is stored in --offsets-file (default
.state/audit-offsets.json) and the next run resumes after it; --from is then ignored unless
--reset. Reading is at-least-once: after a crash the entries since the last store are read
again. See docs/audit-stream.md.
"""

from __future__ import annotations

import argparse
import base64
import json
import sys

from _cli import EXIT_OK, ROOT, add_topology_option, run, settings_from_env, topology_from

from amqp_lab.audit import (
    DEFAULT_OFFSET_FILE,
    OffsetStore,
    StreamEntry,
    StreamReader,
    parse_start,
)
from amqp_lab.cli.parser import CommandParser
from amqp_lab.errors import ConfigurationError, QueueNotFound
from amqp_lab.management import ManagementClient
from amqp_lab.oneline import one_line
from amqp_lab.typed_fields import typed_table


def preview(body: bytes, width: int = 60) -> str:
    text = one_line(body.decode("utf-8", errors="backslashreplace").replace("\n", " "))
    return text if len(text) <= width else text[: width - 1] + "…"


def shown_id(entry: StreamEntry) -> str:
    """The message_id for a person: escaped to one line; one that is not UTF-8 with its other
    bytes as ``\\xNN``; ``-`` when there is none."""
    raw = entry.properties.get("message_id", entry.message_id)
    if isinstance(raw, bytes):
        return one_line(raw.decode("utf-8", "backslashreplace"))
    return one_line(raw) if raw else "-"


def as_line(entry: StreamEntry) -> str:
    if entry.timestamp is not None:
        stamp = entry.timestamp.isoformat()
    else:  # beyond datetime's range (year 9999): the number as it came
        stamp = str(entry.properties.get("timestamp", "-"))
    return (
        f"{entry.offset:>10} {shown_id(entry)[:36]:36} {one_line(entry.routing_key)[:16]:16} "
        f"{stamp:25} {preview(entry.body)}"
    )


def as_json(entry: StreamEntry) -> str:
    """One entry as standard JSON, losslessly: headers and properties in the typed encoding of
    docs/dlq-record.md, the body as text when it is UTF-8, else as base64."""
    try:
        body, encoding = entry.body.decode("utf-8"), "text"
    except UnicodeDecodeError:
        body, encoding = base64.b64encode(entry.body).decode("ascii"), "base64"
    return json.dumps(
        {
            "offset": entry.offset,
            "message_id": entry.message_id,
            "exchange": entry.exchange,
            "routing_key": entry.routing_key,
            "timestamp": entry.timestamp.isoformat() if entry.timestamp else None,
            "properties": typed_table(entry.properties),
            "headers": typed_table(entry.headers),
            "body": body,
            "body_encoding": encoding,
        },
        sort_keys=True,
        allow_nan=False,
    )


def read(args: argparse.Namespace, stream: str) -> int:
    settings = settings_from_env("amqp-lab audit read")
    store = OffsetStore(args.offsets_file) if args.resume else None
    reader = StreamReader(
        settings,
        stream,
        prefetch=args.prefetch,
        store=store,
        name=args.resume,
        store_every=args.store_every,
    )
    if args.reset and store is None:
        raise ConfigurationError("--reset needs --resume NAME")
    show = as_json if args.json else as_line

    def on_entry(entry: StreamEntry) -> None:
        print(show(entry), flush=True)

    report = reader.read(
        on_entry,
        parse_start(args.start),
        limit=args.limit,
        idle_timeout=args.idle_exit,
        reset=args.reset,
    )
    if report.gap:
        print(f"warning: {report.gap}", file=sys.stderr)
    for offset, reason in report.skipped:
        print(f"warning: entry at offset {offset} skipped: {one_line(reason)}", file=sys.stderr)
    where = (
        f"resumed after offset {report.resumed_from}"
        if report.resumed_from is not None
        else f"from {args.start}"
    )
    last = "-" if report.last_offset is None else str(report.last_offset)
    stored = f", stored offset {report.stored[-1]} as {args.resume!r}" if report.stored else ""
    skipped = f", {len(report.skipped)} skipped" if report.skipped else ""
    print(
        f"{report.read} entries read{skipped} from {stream} ({where}; last offset {last}; "
        f"stopped: {report.stopped}{stored})",
        file=sys.stderr,
    )
    return EXIT_OK


def info(stream: str) -> int:
    settings = settings_from_env("amqp-lab audit info")
    with ManagementClient(settings) as api:
        live = api.queue(settings.vhost, stream)
    if live is None:
        raise QueueNotFound(
            f"stream {stream!r} does not exist in vhost {settings.vhost!r}", stream, settings.vhost
        )
    policy = live.get("effective_policy_definition") or {}
    print(f"{stream} in vhost {settings.vhost!r}: type {live.get('type', '?')}")
    print(f"  messages      {live.get('messages', '?')} (offsets, as the broker counts them)")
    disk = live.get("segments") or live.get("message_bytes_persistent")
    print(
        "  on disk       "
        + (f"{disk}" if disk else "not reported by the management API (du the stream's dir)")
    )
    for key in ("max-length-bytes", "max-age"):
        print(f"  {key:13} {policy.get(key, '-')} (policy {live.get('policy') or '-'})")
    segment = (live.get("arguments") or {}).get("x-stream-max-segment-size-bytes", "-")
    print(f"  segment size  {segment} (x-stream-max-segment-size-bytes)")
    return EXIT_OK


def main() -> int:
    parser = CommandParser(description=__doc__.splitlines()[0])
    add_topology_option(parser)
    parser.add_argument("--stream", default=None, help="default: the topology's audit queue")
    sub = parser.add_subparsers(dest="command", required=True)
    reading = sub.add_parser("read", help="print entries, one line (or JSON object) each")
    reading.add_argument("--from", dest="start", default="first", metavar="WHERE")
    reading.add_argument("--resume", default=None, metavar="NAME", help="store/resume offsets")
    reading.add_argument("--reset", action="store_true", help="with --resume: start at --from")
    reading.add_argument("--offsets-file", default=str(ROOT / DEFAULT_OFFSET_FILE), metavar="FILE")
    reading.add_argument("--limit", type=int, default=None, metavar="N")
    reading.add_argument("--idle-exit", type=float, default=2.0, metavar="SECONDS")
    reading.add_argument("--prefetch", type=int, default=500, metavar="N")
    reading.add_argument("--store-every", type=int, default=500, metavar="N")
    reading.add_argument("--json", action="store_true", help="one JSON object per line")
    sub.add_parser("info", help="the stream's size and retention")
    args = parser.parse_args()
    stream = args.stream or topology_from(args).names.audit_queue
    if stream is None:
        raise ConfigurationError("the topology names no audit queue: pass --stream")
    if args.command == "info":
        return info(stream)
    return read(args, stream)


if __name__ == "__main__":
    run(main)
