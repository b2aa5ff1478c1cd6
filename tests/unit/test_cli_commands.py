"""The commands installed with the package ([project.scripts]): each names a function that
exists; the DLQ tools' logic lives in amqp_lab.cli (the scripts only call it); a missing extra
is one line saying which to install; the audit log's default is beside the app."""

from __future__ import annotations

import importlib
import importlib.util
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest

from amqp_lab.cli.common import require_extra
from amqp_lab.cli.state import default_audit_log
from amqp_lab.errors import ConfigurationError

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
COMMANDS = {
    "amqp-lab-worker": "amqp_lab.cli.worker:entry",
    "amqp-lab-topology": "amqp_lab.cli.topology:entry",
    "amqp-lab-dlq": "amqp_lab.cli.dlq:entry",
    "amqp-lab-replay": "amqp_lab.cli.replay:entry",
    "amqp-lab-console": "amqp_lab.cli.console:entry",
    "amqp-lab-relay": "amqp_lab.cli.relay:entry",
}


def test_the_commands_are_installed_with_the_package() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["scripts"] == COMMANDS
    for target in COMMANDS.values():
        module, _, function = target.partition(":")
        assert callable(getattr(importlib.import_module(module), function)), target


@pytest.mark.parametrize("name", ["dlq", "replay", "console", "worker", "setup_topology"])
def test_a_script_only_calls_the_packaged_command(name: str) -> None:
    """The logic is in amqp_lab.cli: the script is its command line in the checkout."""
    text = (ROOT / "scripts" / f"{name}.py").read_text()
    code = [line for line in text.splitlines() if line and not line.startswith(("#", " "))]
    assert len(text.splitlines()) <= 15, text
    assert any(line.startswith("from amqp_lab.cli.") for line in code), text


def test_a_missing_extra_is_one_line_naming_it(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ConfigurationError) as raised:
        require_extra("no_such_package_xyz", "console", "the DLQ console")
    assert str(raised.value) == (
        "the DLQ console needs the console extra (no_such_package_xyz is not installed): "
        "pip install 'amqp-lab[console]'"
    )
    require_extra("json", "console", "the DLQ console")  # present: nothing happens


def test_the_console_without_flask_says_which_extra_to_install(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real = importlib.util.find_spec

    def without_flask(name: str, *args: Any) -> Any:
        return None if name == "flask" else real(name, *args)

    monkeypatch.setattr(importlib.util, "find_spec", without_flask)
    from amqp_lab.cli import console

    with pytest.raises(ConfigurationError) as raised:
        console.main(["--port", "0"])
    assert str(raised.value) == (
        "the DLQ console needs the console extra (flask is not installed): "
        "pip install 'amqp-lab[console]'"
    )


def test_the_console_command_imports_no_flask_until_it_serves() -> None:
    """--help and the extra check must work where Flask is missing."""
    probe = "import sys, amqp_lab.cli.console; print('flask' in sys.modules)"
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True
    )
    assert result.stdout.strip() == "False"


def test_the_audit_log_default_is_beside_the_app_not_the_checkout(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = default_audit_log()
    assert path == Path(".state") / "replay-audit.jsonl" and not path.is_absolute()
    monkeypatch.chdir(tmp_path)
    assert path.resolve() == tmp_path / ".state" / "replay-audit.jsonl"
    assert default_audit_log(tmp_path / "s") == tmp_path / "s" / "replay-audit.jsonl"


@pytest.mark.parametrize("module", ["amqp_lab.cli.replay", "amqp_lab.cli.console"])
def test_audit_log_is_an_explicit_option_defaulting_to_the_current_directory(
    module: str,
) -> None:
    parser = importlib.import_module(module).parser()
    assert parser.parse_args([]).audit_log is None  # main() then uses default_audit_log()
    given = parser.parse_args(["--audit-log", "/var/log/amqp/replay.jsonl"]).audit_log
    assert given == Path("/var/log/amqp/replay.jsonl")
    assert "current directory" in " ".join(parser.format_help().split())
