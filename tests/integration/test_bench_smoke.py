"""benchmarks/bench.py runs and prints its summary (the figures belong to the benchmark)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit

import psycopg
import pytest

from amqp_lab.management import ManagementClient
from amqp_lab.settings import BrokerSettings
from tests.console_support import free_port
from tests.pgsupport import ADMIN_URL, postgres_answers
from tests.support import ROOT, one_error_line, script_env, strict_json

pytestmark = pytest.mark.integration


def run_benchmark(
    script: str, settings: BrokerSettings, *args: str, timeout: float = 200
) -> subprocess.CompletedProcess[str]:
    """benchmarks/``script`` with ``args``, against the broker of ``settings``."""
    return subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / script), *args],
        env=script_env(settings),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def run_bench(settings: BrokerSettings, *args: str) -> subprocess.CompletedProcess[str]:
    return run_benchmark("bench.py", settings, *args)


def summary_of(result: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    assert result.returncode == 0, result.stderr
    return dict(strict_json(result.stdout.strip().splitlines()[-1]))


def bench_queues(settings: BrokerSettings) -> list[str]:
    """The bench's queues (q:bench:<run>:<k>) left in the vhost."""
    with ManagementClient(settings) as api:
        return [q["name"] for q in api.queues(settings.vhost) if q["name"].startswith("q:bench")]


@pytest.mark.timeout(240)
def test_bench_runs_and_prints_the_ratios(vhost: BrokerSettings, tmp_path: Path) -> None:
    history = tmp_path / "history.jsonl"
    history.write_text('{"commit": "before", "consumer_vs_auto_ack": 0.5}\nnot json\n')
    result = run_bench(
        vhost,
        *("--messages", "400", "--repeat", "1", "--seconds", "1", "--rate", "200", "--json"),
        *("--windows", "2", "--concurrency", "2", "--metrics"),
        *("--history", str(history), "--compare"),
    )
    summary = summary_of(result)
    for key in (
        "publisher_vs_fire_and_forget",
        "publisher_vs_sync_confirms",
        "consumer_vs_auto_ack",
        "latency_p50_ms",
        "latency_p99_ms",
        "peak_rss_mb",
    ):
        assert summary[key] > 0, key
    assert summary["latency_samples"] == 400 and summary["latency_windows"] == 2
    low, high = summary["latency_p99_ms_range"]
    assert low <= summary["latency_p99_ms"] <= high
    assert (summary["concurrency"], summary["metrics"]) == (2, True)
    assert "against before" in result.stdout  # --compare: the last recorded run
    recorded = strict_json(history.read_text().splitlines()[-1])
    assert recorded["consumer_vs_auto_ack"] == summary["consumer_vs_auto_ack"]
    assert recorded["broker_version"] == summary["broker_version"] != "?"
    assert summary["queue_type"] == "classic"
    assert summary["queue_arguments"]["x-queue-type"] == "classic"
    assert summary["counts"]["our_consumer"] == 400
    assert bench_queues(vhost) == []


@pytest.mark.timeout(240)
def test_quorum_bench_counts_every_message_of_every_path(vhost: BrokerSettings) -> None:
    # an address list (here the one node twice): repetition i goes through address i
    two = BrokerSettings(f"{vhost.amqp_url},{vhost.amqp_url}", vhost.management_url)
    result = run_bench(
        two,
        *("--queue-type", "quorum", "--messages", "300", "--repeat", "2"),
        *("--seconds", "1", "--windows", "1", "--rate", "200", "--json", "--no-record"),
    )
    summary = summary_of(result)
    # the broker says the queue is a quorum queue (a classic declare of it fails with 406)
    assert summary["queue_type"] == "quorum"
    assert summary["queue_arguments"]["x-queue-type"] == "quorum"
    assert "x-queue-mode" not in summary["queue_arguments"]
    assert summary["queue_arguments"]["x-dead-letter-strategy"] == "at-least-once"
    assert summary["queue_arguments"]["x-overflow"] == "reject-publish"
    # two repetitions of 300 (per-message confirms: at least 500), each path saw all of them
    assert summary["counts"] == {
        "raw_fire_and_forget": 600,
        "pika_sync_confirms": 1000,
        "our_publisher": 600,
        "raw_auto_ack_consume": 600,
        "our_consumer": 600,
    }
    assert summary["latency_samples"] == 200
    assert summary["nodes"] == 2
    assert "repetition" not in result.stderr  # the progress line is a terminal's: silent here
    for name in ("publisher_vs_fire_and_forget", "consumer_vs_auto_ack"):
        low, high = summary[f"{name}_range"]
        assert 0 < low <= high, name
    low, high = summary["our_publisher_msg_s_range"]
    assert 0 < low <= summary["our_publisher_msg_s"] <= high
    assert "(target >= 0.8)" in result.stdout
    assert bench_queues(vhost) == []  # each path's queue deleted after it, the last at the end


def test_quorum_bench_refuses_a_queue_mode_before_touching_the_broker(
    vhost: BrokerSettings,
) -> None:
    result = run_bench(vhost, "--queue-type", "quorum", "--queue-mode", "lazy")
    assert result.returncode == 2
    assert "a quorum queue refuses x-queue-mode" in result.stderr
    assert bench_queues(vhost) == []


@pytest.mark.timeout(240)
def test_walltime_splits_each_path_and_counts_our_units(vhost: BrokerSettings) -> None:
    result = run_benchmark(
        "walltime.py", vhost, *("--messages", "600", "--repeat", "2", "--batch", "200", "--json")
    )
    summary = summary_of(result)
    assert summary["broker_version"] not in ("", "?")
    assert (summary["messages"], summary["batch"]) == (600, 200)
    for path in ("raw_auto_ack", "pika_manual_ack", "our_consumer"):
        wall, cpu, io = (summary[f"{path}_{f}"] for f in ("wall", "cpu", "io_thread"))
        assert wall > 0 and cpu > 0, path
        # the consume loop's thread is part of the process, and nothing runs faster than its
        # CPU allows: a wall below the consuming thread's CPU would be a clock mixed up
        assert 0 < io <= cpu + 0.01 and io <= wall + 0.01, path
    # ours reads and settles in the calling thread; its handler thread commits
    handler = summary["our_consumer_other_threads"]
    assert summary["our_consumer_io_thread"] > handler > 0
    for path in ("raw_auto_ack", "pika_manual_ack"):
        # pika's consume generator runs in the calling thread alone (in a run this small,
        # a thread of the path before may still end: a fraction of a µs a delivery)
        assert summary[f"{path}_other_threads"] < handler / 2, path
    # 600 deliveries a run in units of 2 to 200 (units of one are not batch transactions)
    units, mean = summary["our_consumer_units"], summary["our_consumer_mean_unit"]
    assert units >= 3 and 2 <= mean <= 200
    assert bench_queues(vhost) == []


def bench_databases() -> set[str]:
    """The databases benchmarks/outbox.py creates (amqp_lab_bench_<hex>) on the test server."""
    with psycopg.connect(ADMIN_URL, autocommit=True) as admin:
        rows = admin.execute(
            "SELECT datname FROM pg_database WHERE datname LIKE 'amqp_lab_bench_%'"
        ).fetchall()
    return {row[0] for row in rows}


def hostless(url: str) -> str:
    """``url`` with its host, port and user in the query and none before the path
    (``postgresql:///postgres?host=...``, as a URL for the local socket is written)."""
    parts = urlsplit(url)
    named = {"host": parts.hostname, "port": parts.port, "user": parts.username}
    named |= {"password": parts.password} if parts.password else {}
    query = "&".join(f"{k}={quote(str(v))}" for k, v in named.items() if v is not None)
    return f"{parts.scheme}://{parts.path}?{query}"


@pytest.mark.timeout(240)
@pytest.mark.xdist_group("outbox-bench")  # one after the other: each counts the bench databases
@pytest.mark.parametrize(
    ("store", "hostless_url"),
    [("postgresql", False), ("postgresql", True), ("sqlite", False)],
    ids=["postgresql", "postgresql-hostless-url", "sqlite"],
)
def test_outbox_bench_prints_its_figures_as_json(
    vhost: BrokerSettings, store: str, hostless_url: bool
) -> None:
    """Issue 22's "the benchmark prints its figures with --json", on a real run: each figure
    is there and consistent with its range, every row of every path was counted, and the
    run leaves neither a queue nor a database behind. A ``--postgres`` URL without a host
    before its path (a local socket's) gave the bench database ``postgresql:/name``, which
    libpq refuses."""
    if store == "postgresql" and not postgres_answers(ADMIN_URL):
        pytest.skip("no PostgreSQL answers (AMQP_LAB_TEST_POSTGRES)")
    admin = hostless(ADMIN_URL) if hostless_url else ADMIN_URL
    before = bench_databases() if store == "postgresql" else set()
    result = run_benchmark(
        "outbox.py",
        vhost,
        *("--store", store, "--postgres", admin, "--messages", "300", "--keys", "10"),
        *("--one-key", "20", "--repeat", "2", "--batch", "50", "--rate", "40", "--seconds", "1"),
        "--json",
    )
    summary = summary_of(result)
    assert summary["store"] == store
    assert (summary["messages"], summary["keys"], summary["one_key_messages"]) == (300, 10, 20)
    assert (summary["repeat"], summary["batch"], summary["latency_rows"]) == (2, 50, 40)
    for suffix in ("", "_steady"):
        for path in ("publisher", "relay"):
            low, high = summary[f"{path}{suffix}_msg_s_range"]
            assert 0 < low <= summary[f"{path}{suffix}_msg_s"] <= high, (path, suffix)
        ratio = summary[f"relay{suffix}_msg_s"] / summary[f"publisher{suffix}_msg_s"]
        # the ratio of the unrounded medians, rounded to 3 places
        assert summary[f"relay_vs_publisher{suffix}"] == pytest.approx(ratio, rel=0.01, abs=1e-3)
    assert summary["relay_one_key_msg_s"] > 0
    p50, p99, worst = (summary[f"commit_to_confirm_{p}_ms"] for p in ("p50", "p99", "max"))
    assert 0 < p50 <= p99 <= worst
    assert "(target >= 0.7)" in result.stdout
    assert bench_queues(vhost) == []  # q:bench-outbox-..., deleted after each path
    if store == "postgresql":
        assert bench_databases() == before  # created and dropped


@pytest.mark.parametrize(
    ("options", "expected"),
    [
        (("--one-key", "-3"), "--keys and --one-key must be >= 0"),
        (("--rate", "0.5", "--seconds", "1"), ">= 1 row"),
        (("--batches", "0"), "--batches must be >= 1"),
    ],
)
def test_outbox_bench_refuses_options_that_would_wait_for_nothing(
    options: tuple[str, ...], expected: str
) -> None:
    """Before, a latency run of no rows waited 120 s for its first, --one-key -3 waited 600 s,
    and --batches 0 ended in an unexpected ValueError: exit 2 at once now, before connecting
    (nothing listens at the URL)."""
    nowhere = BrokerSettings(f"amqp://guest:guest@127.0.0.1:{free_port()}/%2F")
    result = run_benchmark("outbox.py", nowhere, "--store", "sqlite", *options, timeout=60)
    assert result.returncode == 2, result.stderr
    assert expected in one_error_line(result.stderr)


def test_outbox_bench_names_an_unreachable_postgresql_in_one_masked_line(
    vhost: BrokerSettings,
) -> None:
    """The admin server refuses the connection: exit 1, one line naming the masked URL
    (before: "unexpected OperationalError"), the password nowhere."""
    admin = f"postgresql://postgres:bench-secret@127.0.0.1:{free_port()}/postgres"
    result = run_benchmark("outbox.py", vhost, "--postgres", admin, "--repeat", "1", timeout=60)
    assert result.returncode == 1, result.stderr
    line = one_error_line(result.stderr)
    assert line.startswith("error: PostgreSQL at postgresql://postgres:***@127.0.0.1:"), line
    assert "Connection refused" in line and "unexpected" not in line, line
    assert "bench-secret" not in result.stdout + result.stderr


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    "command",
    [
        ("bench.py", "--no-record"),
        ("walltime.py",),
        ("outbox.py", "--store", "sqlite"),
    ],
)
def test_a_benchmark_with_no_broker_says_so_in_one_line(command: tuple[str, ...]) -> None:
    """Nothing listens at the URL: exit 1, one ``error:`` line naming the masked URL, no
    traceback, the password nowhere."""
    settings = BrokerSettings(f"amqp://guest:bench-secret@127.0.0.1:{free_port()}/%2F")
    script, *options = command
    result = run_benchmark(script, settings, *options, "--repeat", "1", timeout=100)
    assert result.returncode == 1, result.stderr
    line = one_error_line(result.stderr)
    assert "cannot connect" in line and "127.0.0.1" in line, line
    assert "bench-secret" not in result.stdout + result.stderr
