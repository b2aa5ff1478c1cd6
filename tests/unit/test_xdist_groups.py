"""The cluster and serial tests run on one pytest-xdist worker, one after the other: each
cluster module's fixture stops and starts containers of a fixed name, and two workers running
one of them at once stopped each other's cluster (CI: ``join_cluster`` exit 137, Docker's 409
"removal ... already in progress", "node rabbit@rmq1 has no container"). The grouping is
``tests/conftest.py``'s ``xdist_group`` marker; two things broke it silently: a marker added
after xdist read the groups (pytest-dev/pytest-xdist#1241), and pytest 9.2, with which
``--dist loadgroup`` groups nothing (pytest-dev/pytest-xdist#1386)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.support import ROOT

pytestmark = [pytest.mark.unit, pytest.mark.timeout(120)]

PROBE = """
import os
import pytest


@pytest.mark.parametrize("i", range(3))
@pytest.mark.{first}
def test_first(i: int) -> None:
    print("ran-on", os.environ["PYTEST_XDIST_WORKER"])


@pytest.mark.parametrize("i", range(3))
@pytest.mark.{second}
def test_second(i: int) -> None:
    print("ran-on", os.environ["PYTEST_XDIST_WORKER"])
"""


def workers_of(first: str, second: str) -> set[str]:
    """The xdist workers (of two) that ran three tests marked ``first`` and three marked
    ``second`` under the project's conftest, ``--dist loadgroup`` as CI runs them."""
    probe = ROOT / "tests" / "unit" / f"_xdist_probe_{first}_{second}.py"
    probe.write_text(PROBE.format(first=first, second=second))
    marker = f"{first} or {second}"
    try:
        command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-n", "2"]
        command += ["--dist", "loadgroup", "-m", marker, "-rA", "-o", "addopts=", str(probe)]
        result = subprocess.run(
            command,
            capture_output=True,
            text=True,
            timeout=100,
            cwd=ROOT,
        )
    finally:
        probe.unlink()
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    ran = [line.split()[1] for line in result.stdout.splitlines() if line.startswith("ran-on ")]
    assert len(ran) == 6, result.stdout[-2000:]
    return set(ran)


def test_the_cluster_and_serial_tests_run_on_one_worker() -> None:
    assert len(workers_of("cluster", "serial")) == 1


def test_other_tests_spread_over_the_workers() -> None:
    """The probe can fail: tests of no group go to both workers (xdist's load distribution
    sends the first of them to each)."""
    assert workers_of("unit", "integration") == {"gw0", "gw1"}
