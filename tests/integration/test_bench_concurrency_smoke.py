"""benchmarks/concurrency.py runs at a tiny size and prints its cases and ratios (the figures
themselves, and whether they meet the targets, belong to the benchmark)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from amqp_lab.settings import BrokerSettings
from tests.pgsupport import ADMIN_URL, postgres_answers
from tests.support import ROOT, script_env, strict_json

pytestmark = [pytest.mark.integration]


@pytest.mark.timeout(180)
def test_concurrency_bench_runs_and_prints_the_ratios(vhost: BrokerSettings) -> None:
    with_postgres = postgres_answers(ADMIN_URL)
    result = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "concurrency.py"),
            "--messages",
            "16",
            "--handler-seconds",
            "0.05",
            "--postgres-url",
            ADMIN_URL,
            *([] if with_postgres else ["--skip-postgres"]),
            "--json",
        ],
        env=script_env(vhost),
        capture_output=True,
        text=True,
        timeout=170,
    )
    assert result.returncode == 0, result.stderr
    summary = strict_json(result.stdout.strip().splitlines()[-1])
    expected = ["baseline", "threads", "processes_sqlite"]
    if with_postgres:
        expected.append("processes_postgres")
    assert list(summary["cases"]) == expected
    for key, case in summary["cases"].items():
        assert case["msg_s"] > 0, key
        assert case["vs_baseline"] > 0, key
        assert sum(case["per_process"]) == 16, key
        assert case["prefetch"] >= case["concurrency"], key
    assert summary["cases"]["baseline"]["vs_baseline"] == 1.0
    assert summary["cases"]["threads"]["concurrency"] == 8
    assert summary["cases"]["processes_sqlite"]["processes"] == 4
    for key in expected[1:]:
        assert summary["ratios"][f"{key}_vs_baseline"] > 0, key
    assert set(summary["targets"]) == {"threads_vs_baseline", "processes_sqlite_vs_baseline"}
    assert isinstance(summary["targets_met"], bool)
    assert "target" in result.stdout  # the table says whether the targets were met
