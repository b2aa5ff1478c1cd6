"""A wheel built from the repository, installed in a fresh venv outside it, applies the
packaged topology and runs a worker with a handler from another module - nothing of the
repository (lab, scripts, topology files) is on its path."""

from __future__ import annotations

import shutil
import subprocess
import sys
import textwrap
import venv
from collections.abc import Iterator
from pathlib import Path

import pytest

from amqp_lab.settings import BrokerSettings
from tests.brokers import ROOT
from tests.support import script_env

pytestmark = [pytest.mark.integration]

HANDLER = textwrap.dedent(
    """
    from amqp_lab.errors import BusinessError


    def handle(task, db):
        if not isinstance(task.body, dict) or "invoice" not in task.body:
            raise BusinessError("no invoice")
        db.execute("CREATE TABLE IF NOT EXISTS sent (message_id TEXT, invoice TEXT)")
        db.execute("INSERT INTO sent VALUES (?, ?)", (task.message_id, task.body["invoice"]))
    """
)

PUBLISH = textwrap.dedent(
    """
    import os, sys
    import amqp_lab
    from amqp_lab.message import message_for
    from amqp_lab.publishing import Publisher
    from amqp_lab.settings import BrokerSettings
    from amqp_lab.topology import load_topology

    names = load_topology().names
    settings = BrokerSettings(os.environ["EAI_AMQP_URL"], os.environ["EAI_MGMT_URL"])
    with Publisher(settings) as publisher:
        publisher.publish(message_for(names, {"invoice": "INV-1"}, message_id="inv-1"))
        publisher.publish(message_for(names, {"other": 1}, message_id="inv-2"))
    print(amqp_lab.__file__)
    """
)


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The bin/ directory of a fresh venv with the wheel (and its dependencies) installed."""
    work = tmp_path_factory.mktemp("wheel")
    # built from a copy of what git tracks: setuptools writes build/ and *.egg-info next to
    # the sources, which must not land in the checkout (nor untracked files in the wheel)
    source = work / "source"
    tracked = (
        subprocess.run(["git", "-C", str(ROOT), "ls-files", "-z"], capture_output=True, check=True)
        .stdout.decode()
        .split("\0")
    )
    for name in filter(None, tracked):
        if (ROOT / name).is_file():
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, source / name)
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
         "-w", str(work / "dist"), str(source)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert built.returncode == 0, built.stderr
    (wheel,) = (work / "dist").glob("amqp_lab-*.whl")
    venv.create(work / "venv", with_pip=True)
    bin_dir = work / "venv" / "bin"
    installed = subprocess.run(
        [str(bin_dir / "pip"), "install", "-q", str(wheel)],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert installed.returncode == 0, installed.stderr
    yield bin_dir


def run_in(cwd: Path, settings: BrokerSettings, *argv: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in script_env(settings).items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    # the user's own module is found in the working directory, as with python -m
    return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=120)


@pytest.mark.timeout(900)
def test_an_installed_wheel_applies_the_packaged_topology_and_runs_your_handler(
    installed: Path, vhost: BrokerSettings, tmp_path: Path
) -> None:
    app = tmp_path / "app"
    app.mkdir()
    (app / "invoicing.py").write_text(HANDLER)
    (app / "publish.py").write_text(PUBLISH)

    applied = run_in(app, vhost, str(installed / "amqp-lab-topology"))
    assert applied.returncode == 0, applied.stderr
    assert "created queue q:tasks" in applied.stdout
    published = run_in(app, vhost, str(installed / "python"), "publish.py")
    assert published.returncode == 0, published.stderr
    package = Path(published.stdout.strip())
    assert package.is_relative_to(installed.parent) and not package.is_relative_to(ROOT)

    store = tmp_path / "dedup.sqlite3"
    worker = run_in(
        app, vhost, str(installed / "amqp-lab-worker"), "--handler", "invoicing:handle",
        "--idle-exit", "1", "--dedup-url", str(store),
    )  # fmt: skip
    assert worker.returncode == 0, worker.stderr
    outcomes = [line.split()[:2] for line in worker.stdout.splitlines() if "outcome=" in line]
    assert outcomes == [
        ["message_id=inv-1", "outcome=processed"],
        ["message_id=inv-2", "outcome=dead-lettered"],
    ]
    import sqlite3

    with sqlite3.connect(store) as db:
        assert db.execute("SELECT message_id, invoice FROM sent").fetchall() == [("inv-1", "INV-1")]
    # the outbox relay is installed too: its tables' SQL for your migrations, and a relay run
    schema = run_in(app, vhost, str(installed / "amqp-lab-relay"), "schema", "--dialect", "sqlite")
    assert schema.returncode == 0 and "CREATE TABLE IF NOT EXISTS amqp_lab_outbox" in schema.stdout
    relay = run_in(
        app, vhost, str(installed / "amqp-lab-relay"),
        "--outbox-url", str(store), "--idle-exit", "0.5",
    )  # fmt: skip
    assert relay.returncode == 0, relay.stderr
    assert "relay stopped (idle for 0.5 s): 0 sent" in relay.stdout
