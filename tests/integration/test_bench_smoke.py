"""benchmarks/bench.py runs and prints its summary (the figures belong to the benchmark)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from amqp_lab.settings import BrokerSettings
from tests.support import ROOT, script_env

pytestmark = pytest.mark.integration


@pytest.mark.timeout(240)
def test_bench_runs_and_prints_the_ratios(vhost: BrokerSettings) -> None:
    result = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "bench.py"),
            "--messages",
            "400",
            "--repeat",
            "1",
            "--seconds",
            "1",
            "--rate",
            "200",
            "--json",
        ],
        env=script_env(vhost),
        capture_output=True,
        text=True,
        timeout=200,
    )
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    for key in (
        "publisher_vs_fire_and_forget",
        "publisher_vs_sync_confirms",
        "consumer_vs_auto_ack",
        "latency_p50_ms",
        "latency_p99_ms",
        "peak_rss_mb",
    ):
        assert summary[key] > 0, key
    assert summary["latency_samples"] == 200
