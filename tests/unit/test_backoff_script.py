"""scripts/backoff.py prints exact schedules (no broker needed)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.support import ROOT

pytestmark = pytest.mark.unit


def backoff(*args: str) -> list[str]:
    result = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "backoff.py"), *args],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    return result.stdout.splitlines()


def waits(lines: list[str]) -> list[float]:
    return [float(line.split("wait=")[1]) for line in lines]


def test_exponential_schedule() -> None:
    assert backoff("--base", "1", "--attempts", "0-5") == [
        f"attempt={n} wait={w}" for n, w in enumerate([1, 2, 4, 8, 16, 32])
    ]


def test_capped_schedule() -> None:
    lines = backoff("--base", "1", "--cap", "30", "--attempts", "0-8")
    assert waits(lines) == [1, 2, 4, 8, 16, 30, 30, 30, 30]
    assert waits(lines)[-3:] == [30, 30, 30]


def test_full_jitter_samples_stay_within_the_bound_and_vary() -> None:
    first = waits(backoff("--base", "1", "--attempt", "3", "--jitter", "full", "--samples", "20"))
    second = waits(backoff("--base", "1", "--attempt", "3", "--jitter", "full", "--samples", "20"))
    assert len(first) == len(second) == 20
    assert all(0 <= w <= 8 for w in first + second)
    assert first != second
    assert len(set(first)) > 1


def test_bad_range_is_a_usage_error() -> None:
    result = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "backoff.py"), "--attempts", "5-1"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 2
    assert "expected 0 <= N <= M" in result.stderr
