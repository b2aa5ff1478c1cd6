"""benchmarks/bench.py runs and prints its summary (the figures belong to the benchmark)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from amqp_lab.management import ManagementClient
from amqp_lab.settings import BrokerSettings
from tests.console_support import free_port
from tests.support import ROOT, one_error_line, script_env, strict_json

pytestmark = pytest.mark.integration

BENCH = str(ROOT / "benchmarks" / "bench.py")


def run_bench(settings: BrokerSettings, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, BENCH, *args],
        env=script_env(settings),
        capture_output=True,
        text=True,
        timeout=200,
    )


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
    result = subprocess.run(
        [
            *(sys.executable, str(ROOT / "benchmarks" / "walltime.py")),
            *("--messages", "600", "--repeat", "2", "--batch", "200", "--json"),
        ],
        env=script_env(vhost),
        capture_output=True,
        text=True,
        timeout=200,
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
    result = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / script), *options, "--repeat", "1"],
        env=script_env(settings),
        capture_output=True,
        text=True,
        timeout=100,
    )
    assert result.returncode == 1, result.stderr
    line = one_error_line(result.stderr)
    assert "cannot connect" in line and "127.0.0.1" in line, line
    assert "bench-secret" not in result.stdout + result.stderr
