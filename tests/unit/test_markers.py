"""What a test module's markers claim, checked from its source: ``no_plain_consumer`` (CI's
``--concurrency 4`` leg leaves such a module out) is only on modules that run no plain
consumer, in-process or as the worker script, so AMQP_LAB_TEST_CONCURRENCY cannot change what
they see."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

INTEGRATION = Path(__file__).resolve().parents[1] / "integration"
# what starts a plain consumer in a test: the library's class, the helpers of tests/support.py
# that apply AMQP_LAB_TEST_CONCURRENCY or run the worker script, the worker command
PLAIN_CONSUMER = re.compile(
    r"\bConsumer\(|consumer_config\(|settled_order\(|TEST_CONCURRENCY|with_concurrency\(|"
    r"run_worker\(|worker\.py|cli\.worker|amqp-lab-worker|\bworker\.main\("
)


def module_markers(path: Path) -> set[str]:
    """The ``pytest.mark.<name>`` names in the module's ``pytestmark``."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "pytestmark" for t in node.targets
        ):
            for sub in ast.walk(node.value):
                if (
                    isinstance(sub, ast.Attribute)
                    and isinstance(sub.value, ast.Attribute)
                    and sub.value.attr == "mark"
                ):
                    names.add(sub.attr)
    return names


def marked() -> list[Path]:
    return [
        p for p in sorted(INTEGRATION.glob("test_*.py")) if "no_plain_consumer" in module_markers(p)
    ]


def test_the_marker_is_used_and_read_from_the_module() -> None:
    assert {p.name for p in marked()} >= {"test_outbox_faults.py", "test_chaos_ordered.py"}
    assert "no_plain_consumer" not in module_markers(INTEGRATION / "test_failure_model.py")


@pytest.mark.parametrize("path", marked(), ids=lambda p: p.name)
def test_a_module_marked_no_plain_consumer_starts_none(path: Path) -> None:
    found = PLAIN_CONSUMER.findall(path.read_text(encoding="utf-8"))
    assert not found, f"{path.name} is marked no_plain_consumer but uses {sorted(set(found))}"


@pytest.mark.parametrize(
    "module",
    [
        "test_failure_model.py",  # consumer_config(...)
        "test_memory_alarm.py",  # run_worker(...): the worker script, with --concurrency
        "test_pipeline.py",
    ],
)
def test_the_pattern_finds_what_starts_a_plain_consumer(module: str) -> None:
    source = (INTEGRATION / module).read_text(encoding="utf-8")
    assert PLAIN_CONSUMER.search(source)
    assert "no_plain_consumer" not in module_markers(INTEGRATION / module)
