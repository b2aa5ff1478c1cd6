"""A wheel built from the repository, installed in a fresh venv outside it, has the five
commands (amqp-lab-worker, -topology, -dlq, -replay, -console), applies the packaged topology,
runs a worker with a handler from another module, lists and replays its DLQ with the audit log
beside the app, and ships the same topology files as the repository's topology/ - nothing of
the repository (lab, scripts, topology files) is on its path."""

from __future__ import annotations

import json
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

COMMANDS = (
    "amqp-lab-worker",
    "amqp-lab-topology",
    "amqp-lab-dlq",
    "amqp-lab-replay",
    "amqp-lab-console",
    "amqp-lab-relay",
)

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


def test_the_wheel_installs_every_command(installed: Path, tmp_path: Path) -> None:
    for command in COMMANDS:
        assert (installed / command).is_file(), command
        help_ = subprocess.run(
            [str(installed / command), "--help"], capture_output=True, text=True, timeout=60
        )
        assert help_.returncode == 0 and help_.stdout.startswith("usage: "), (command, help_)
        needed = ["--handler", "app:handle"] if command == "amqp-lab-worker" else []
        refused = subprocess.run(
            [str(installed / command), *needed, "--no-such-option"],
            capture_output=True,
            text=True,
            timeout=60,
            cwd=tmp_path,
        )
        assert (refused.returncode, refused.stdout) == (2, ""), (command, refused)
        assert refused.stderr.endswith("error: unrecognized arguments: --no-such-option\n")
        assert refused.stderr.count("\n") == 1, (command, refused.stderr)


def test_the_console_without_its_extra_says_which_to_install(
    installed: Path, tmp_path: Path
) -> None:
    """The wheel was installed without extras: no Flask."""
    result = subprocess.run(
        [str(installed / "amqp-lab-console"), "--port", "0"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
        env={"PATH": "/usr/bin:/bin", "EAI_AMQP_URL": "amqp://guest:guest@127.0.0.1:1/x"},
    )
    assert result.returncode == 1
    assert result.stderr == (
        "error: the DLQ console needs the console extra (flask is not installed): "
        "pip install 'amqp-lab[console]'\n"
    )


def test_the_wheel_ships_the_repositorys_topology_files(installed: Path, tmp_path: Path) -> None:
    probe = "import amqp_lab.topology.files as f; print(f.packaged('definitions.json').parent)"
    where = subprocess.run(  # outside the checkout: its amqp_lab/ must not be found first
        [str(installed / "python"), "-c", probe],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert where.returncode == 0, where.stderr
    data = Path(where.stdout.strip())
    assert data.is_relative_to(installed.parent) and not data.is_relative_to(ROOT)
    shipped = {p.name: p.read_bytes() for p in data.glob("*.json")}
    top_level = {p.name: p.read_bytes() for p in (ROOT / "topology").glob("*.json")}
    assert shipped == top_level and len(shipped) == 4
    schema = data.parent / "schema.json"
    assert schema.read_bytes() == (ROOT / "amqp_lab" / "topology" / "schema.json").read_bytes()


@pytest.mark.timeout(900)
def test_the_installed_dlq_tools_list_and_replay_with_the_audit_log_beside_the_app(
    installed: Path, vhost: BrokerSettings, tmp_path: Path
) -> None:
    app = tmp_path / "app"
    app.mkdir()
    (app / "invoicing.py").write_text(HANDLER)
    (app / "publish.py").write_text(PUBLISH)
    assert run_in(app, vhost, str(installed / "amqp-lab-topology")).returncode == 0
    assert run_in(app, vhost, str(installed / "python"), "publish.py").returncode == 0
    worker = run_in(
        app, vhost, str(installed / "amqp-lab-worker"), "--handler", "invoicing:handle",
        "--idle-exit", "1", "--dedup-url", str(tmp_path / "dedup.sqlite3"),
    )  # fmt: skip
    assert worker.returncode == 0, worker.stderr

    listed = run_in(app, vhost, str(installed / "amqp-lab-dlq"), "--json")
    assert listed.returncode == 0, listed.stderr
    assert [json.loads(line)["message_id"] for line in listed.stdout.splitlines()] == ["inv-2"]
    alert = run_in(app, vhost, str(installed / "amqp-lab-dlq"), "--alert-depth", "0")
    assert alert.returncode == 2 and alert.stdout.startswith("ALERT: DLQ q:tasks:dlq")

    replayed = run_in(app, vhost, str(installed / "amqp-lab-replay"), "--message-id", "inv-2")
    assert replayed.returncode == 0, replayed.stderr
    assert "message_id=inv-2 status=replayed" in replayed.stdout
    audit = app / ".state" / "replay-audit.jsonl"  # beside the app, not in any checkout
    (line,) = audit.read_text().splitlines()
    assert (json.loads(line)["message_id"], json.loads(line)["status"]) == ("inv-2", "replayed")
    elsewhere = tmp_path / "audit" / "replay.jsonl"
    again = run_in(
        app, vhost, str(installed / "amqp-lab-replay"), "--all", "--dry-run",
        "--audit-log", str(elsewhere),
    )  # fmt: skip
    assert again.returncode == 0, again.stderr
    assert elsewhere.read_text() == ""  # the file --audit-log named; a dry run writes nothing
