"""Helpers for integration tests: run scripts as a user would, poll for eventual states."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit, urlunsplit

import pytest

from amqp_lab.connection import open_channel
from amqp_lab.consuming.consumer import ConsumerConfig
from amqp_lab.message import OutgoingMessage
from amqp_lab.publishing.blocking import Publisher
from amqp_lab.settings import BrokerSettings
from amqp_lab.topology import load_topology
from lab.handler import task_message

ROOT = Path(__file__).resolve().parent.parent
T = TypeVar("T")


def script_env(settings: BrokerSettings) -> dict[str, str]:
    env = dict(os.environ)
    env["EAI_AMQP_URL"] = settings.amqp_url
    if settings.management_url:
        env["EAI_MGMT_URL"] = settings.management_url
    return env


TEST_CONCURRENCY = int(os.environ.get("AMQP_LAB_TEST_CONCURRENCY", "1"))
"""Handlers at once in the tests' consumers and workers (CI runs the failure model with 4)."""


def with_concurrency(name: str, args: tuple[str, ...]) -> tuple[str, ...]:
    """worker.py's arguments with ``--concurrency`` TEST_CONCURRENCY, bounded by its prefetch
    (each handler needs a delivery of its own), unless the test sets one itself or runs the
    ordered consumer (one handler at a time)."""
    if name != "worker.py" or TEST_CONCURRENCY == 1 or {"--concurrency", "--ordered"} & set(args):
        return args
    prefetch = int(args[args.index("--prefetch") + 1]) if "--prefetch" in args else None
    batch = int(args[args.index("--ack-batch") + 1]) if "--ack-batch" in args else 1
    concurrency = (
        TEST_CONCURRENCY if prefetch is None else max(1, min(TEST_CONCURRENCY, prefetch // batch))
    )
    return (*args, "--concurrency", str(concurrency))


def settled_order(items: list[T]) -> list[T]:
    """``items`` (reports, outcomes) as a test compares them: in delivery order with one handler
    at a time, sorted with several (they settle as they finish, in no fixed order)."""
    return list(items) if TEST_CONCURRENCY == 1 else sorted(items)  # type: ignore[type-var]


def consumer_config(**options: Any) -> ConsumerConfig:
    """ConsumerConfig for the lab topology, with TEST_CONCURRENCY handlers at once (bounded by
    prefetch / ack_batch) unless ``concurrency`` is given."""
    prefetch, batch = options.get("prefetch", 10), options.get("ack_batch", 1)
    options.setdefault("concurrency", max(1, min(TEST_CONCURRENCY, prefetch // batch)))
    return ConsumerConfig(NAMES, **options)


def run_script(
    settings: BrokerSettings, name: str, *args: str, timeout: float = 60, **kw: Any
) -> subprocess.CompletedProcess[str]:
    """Run scripts/<name> as a user would, with EAI_AMQP_URL / EAI_MGMT_URL for ``settings``."""
    return subprocess.run(
        [sys.executable, str(ROOT / "scripts" / name), *with_concurrency(name, args)],
        env=script_env(settings),
        capture_output=True,
        text=True,
        timeout=timeout,
        **kw,
    )


def wait_for(
    predicate: Callable[[], Any],
    timeout: float = 20,
    interval: float = 0.2,
    what: str = "condition",
) -> Any:
    """Poll ``predicate`` until it returns a truthy value; fail the test after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout}s waiting for {what} (last: {value!r})")
        time.sleep(interval)


def ready_count(settings: BrokerSettings, queue: str) -> int:
    """Ready messages in ``queue`` now (queue.declare passive; exact, no statistics lag)."""
    with open_channel(settings) as channel:
        return int(channel.queue_declare(queue, passive=True).method.message_count)


def consumer_count(settings: BrokerSettings, queue: str) -> int:
    """Consumers subscribed to ``queue`` now (queue.declare passive; exact, no statistics lag)."""
    with open_channel(settings) as channel:
        return int(channel.queue_declare(queue, passive=True).method.consumer_count)


def get_all(settings: BrokerSettings, queue: str) -> list[tuple[Any, Any, bytes]]:
    """Consume (basic.get + ack) every message in ``queue``: [(method, properties, body)]."""
    messages: list[tuple[Any, Any, bytes]] = []
    with open_channel(settings) as channel:
        while True:
            method, properties, body = channel.basic_get(queue, auto_ack=True)
            if method is None:
                return messages
            messages.append((method, properties, body))


def parse_lines(text: str) -> list[dict[str, str]]:
    """Parse ``key=value`` lines (the scripts' outcome lines) into dicts."""
    rows = []
    for line in text.splitlines():
        if line.startswith("message_id="):
            rows.append(dict(part.split("=", 1) for part in line.split(" ") if "=" in part))
    return rows


def wait_ready_count(
    settings: BrokerSettings, queue: str, expected: int, timeout: float = 20
) -> None:
    """Poll until ``queue`` holds exactly ``expected`` ready messages. Needed after browse and
    replay: messages returned with basic.nack(requeue) reach the queue asynchronously, so a
    count read from another connection can briefly lag."""
    wait_for(
        lambda: ready_count(settings, queue) == expected,
        timeout,
        what=f"{expected} ready in {queue} (now {ready_count(settings, queue)})",
    )


def publish(settings: BrokerSettings, *specs: tuple[str, str]) -> None:
    """Publish (kind, message_id) pairs with confirms."""
    with Publisher(settings) as publisher:
        for seq, (kind, message_id) in enumerate(specs, 1):
            publisher.publish(task_message(kind, seq, message_id))


def run_worker(settings: BrokerSettings, tmp_path: Path, *args: str) -> list[dict[str, str]]:
    """Run scripts/worker.py until 1.5 s idle with a dedup store in ``tmp_path``; its lines."""
    result = run_script(
        settings,
        "worker.py",
        "--idle-exit",
        "1.5",
        "--dedup-path",
        str(tmp_path / "dedup.sqlite3"),
        *args,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return parse_lines(result.stdout)


def lines_for(rows: list[dict[str, str]], message_id: str) -> list[tuple[str, str, str]]:
    """(outcome, attempts, redelivered) of each worker line for ``message_id``."""
    return [
        (r["outcome"], r["attempts"], r["redelivered"])
        for r in rows
        if r["message_id"] == message_id
    ]


def start_script(settings: BrokerSettings, name: str, *args: str) -> subprocess.Popen[str]:
    """Start scripts/<name> in the background (stdout and stderr piped, text)."""
    return subprocess.Popen(
        [sys.executable, str(ROOT / "scripts" / name), *with_concurrency(name, args)],
        env=script_env(settings),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def through(settings: BrokerSettings, port: int, **overrides: Any) -> BrokerSettings:
    """The same broker, vhost and credentials, reached through 127.0.0.1:``port`` (a proxy)."""
    parts = urlsplit(settings.amqp_url)
    netloc = parts.netloc.rsplit("@", 1)[0] + f"@127.0.0.1:{port}"
    url = urlunsplit((parts.scheme, netloc, parts.path, parts.query, ""))
    return BrokerSettings(url, settings.management_url, **overrides)


def one_error_line(stderr: str) -> str:
    """The single ``error:`` line of a script's stderr; fails on a traceback or several."""
    assert "Traceback" not in stderr, stderr
    errors = [line for line in stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, stderr
    return errors[0]


NAMES = load_topology().names
"""The roles of the lab topology (topology/definitions.json, packaged with amqp_lab)."""


def lab_message(**fields: Any) -> OutgoingMessage:
    """An OutgoingMessage to the lab topology's exchange and routing key (its work queue)."""
    return OutgoingMessage(exchange=NAMES.exchange, routing_key=NAMES.routing_key, **fields)


def strict_json(text: str | bytes) -> Any:
    """Parse ``text`` as standard JSON (RFC 8259) or fail: Python's parser takes NaN, Infinity
    and -Infinity, which other parsers refuse, so they raise here."""

    def refuse(name: str) -> Any:
        raise ValueError(f"not standard JSON: {name}")

    return json.loads(text, parse_constant=refuse)


def strict_json_lines(text: str) -> list[Any]:
    """Each line of ``text`` (a ``--json`` output) parsed by :func:`strict_json`."""
    return [strict_json(line) for line in text.splitlines()]
