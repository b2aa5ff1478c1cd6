"""The dedicated local node: a restart from a checkout whose data dir is not the running
node's refuses and touches nothing (it would bring the node back empty)."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest

from lab.local_broker import LocalBroker, LocalBrokerError

pytestmark = pytest.mark.unit


class Recording(LocalBroker):
    """A LocalBroker whose rabbitmqctl answers from a script, recording what was asked."""

    running_in = "/elsewhere/.broker/data/amqplab@localhost"
    asked: list[tuple[str, ...]]

    def _ctl(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        self.asked.append(args)
        out = f'"{self.running_in}"\n' if args[0] == "eval" else ""
        return subprocess.CompletedProcess(["rabbitmqctl", *args], 0, out, "")


def node(tmp_path: Path, running_in: str) -> Any:
    broker = Recording(base_dir=tmp_path / ".broker")
    broker.asked = []
    broker.running_in = running_in
    return broker


def test_a_restart_from_another_checkout_refuses(tmp_path: Path) -> None:
    broker = node(tmp_path, "/elsewhere/.broker/data/amqplab@localhost")
    with pytest.raises(LocalBrokerError, match="another checkout"):
        broker.restart()
    assert broker.asked == [("eval", "rabbit_mnesia:dir().")]  # nothing stopped


def test_the_own_data_dir_is_recognised(tmp_path: Path) -> None:
    broker = node(tmp_path, f"{tmp_path}/.broker/data/amqplab@localhost")
    assert broker.running_data_dir() == tmp_path / ".broker" / "data" / "amqplab@localhost"
    assert broker.running_data_dir().is_relative_to(broker.base_dir / "data")
