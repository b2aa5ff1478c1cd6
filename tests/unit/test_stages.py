"""benchmarks/stages.py: every stage of the consumer's path is timed, with no broker."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]

STAGES_APART = "redelivery count (per redelivery)"  # not on a first delivery's path
LOOPS = ("frame loop, pika's", "frame loop, ours")  # the same bytes through either loop
STAGES = {
    "frame parse",
    "header decode",
    "task build",
    "dedup claim",
    "handler runner",
    "hand-off",
    "settlement",
    "spans and observers",
    "report line",
    "total",
    STAGES_APART,
    *LOOPS,
}


@pytest.mark.timeout(120)
def test_stages_prints_every_stage_of_the_table_as_strict_json() -> None:
    out = subprocess.run(
        [
            *(sys.executable, "benchmarks/stages.py", "--deliveries", "600"),
            *("--batch", "100", "--repeat", "1", "--json"),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
        timeout=100,
    ).stdout

    def refuse(name: str) -> None:
        raise ValueError(name)

    table = json.loads(out, parse_constant=refuse)["us_per_delivery"]
    assert set(table) == STAGES
    assert all(value >= 0 for value in table.values())
    assert table["task build"] > 0 and table["dedup claim"] > 0
    assert all(table[loop] > 0 for loop in LOOPS)
    parts = sum(v for k, v in table.items() if k not in ("total", STAGES_APART, *LOOPS))
    assert table["total"] == pytest.approx(parts, abs=0.05)
