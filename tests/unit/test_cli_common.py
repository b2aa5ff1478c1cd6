"""The command line's lookups: ``--handler MODULE:FUNCTION`` and ``--topology FILE`` fail with
one clear error naming what is wrong."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pytest

from amqp_lab.cli.common import load_callable, topology_from
from amqp_lab.consuming.handler_contract import check_handler
from amqp_lab.errors import ConfigurationError, TopologyError

pytestmark = pytest.mark.unit


def test_a_handler_is_found_by_module_and_attribute() -> None:
    assert load_callable("lab.handler:lab_handler").__name__ == "lab_handler"


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("lab.handler", "expected package.module:function"),
        (":handle", "expected package.module:function"),
        ("no_such_module_xyz:handle", "cannot import 'no_such_module_xyz'"),
        ("lab.handler:no_such_function", "'lab.handler' has no 'no_such_function'"),
        ("lab.handler:KINDS", "handler lab.handler:KINDS is not callable"),
    ],
)
def test_a_bad_handler_spec_is_one_clear_error(spec: str, message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        check_handler(load_callable(spec), spec)


def test_a_handler_module_in_the_working_directory_is_found(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "my_handlers_xyz.py").write_text("def handle(task, db):\n    pass\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", ".")])
    assert load_callable("my_handlers_xyz:handle").__name__ == "handle"


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "no-such.json"),
        ("{not json", "not JSON|JSON"),
        ('{"queues": []}', "amqp_lab"),
    ],
)
def test_a_bad_topology_file_is_one_clear_error(
    tmp_path: Path, content: str | None, message: str
) -> None:
    path = tmp_path / "no-such.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(TopologyError, match=message):
        assert topology_from(argparse.Namespace(topology=str(path))).names is None
