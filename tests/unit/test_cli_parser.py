"""A refused option is one line: ``error: ...`` on stderr, exit 2, no usage dump - for every
amqp-lab command and every script (they all parse with amqp_lab.cli.parser.CommandParser)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from amqp_lab.cli.parser import EXIT_USAGE, CommandParser

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
COMMAND_SOURCES = sorted(
    [
        *(ROOT / "scripts").glob("*.py"),
        *(ROOT / "amqp_lab" / "cli").glob("*.py"),
        *(ROOT / "benchmarks").glob("*.py"),
        *(ROOT / "examples").rglob("*.py"),
        *(ROOT / "lab").rglob("*.py"),
    ]
)


def parser() -> CommandParser:
    p = CommandParser(prog="cmd")
    p.add_argument("--retry", choices=["requeue", "backoff"], default="requeue")
    p.add_argument("--count", type=int, default=1)
    p.add_argument("--handler", required=True)
    sub = p.add_subparsers(dest="command")
    sub.add_parser("purge").add_argument("--days", type=float, required=True)
    return p


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--handler", "h", "--retry", "x"], "error: argument --retry: invalid choice: 'x'"),
        (["--handler", "h", "--count", "two"], "error: argument --count: invalid int value"),
        ([], "error: the following arguments are required: --handler"),
        (["--handler", "h", "--nope"], "error: unrecognized arguments: --nope"),
        (["--handler", "h", "purge"], "error: the following arguments are required: --days"),
    ],
)
def test_a_refused_option_is_one_error_line_and_exit_2(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_:
        parser().parse_args(argv)
    assert exit_.value.code == EXIT_USAGE == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.count("\n") == 1 and err.startswith(message), err
    assert "usage:" not in err


def test_a_message_with_line_breaks_stays_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        parser().error("two\nlines\x1b[2J")
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: two")


def test_help_still_lists_every_option(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        parser().parse_args(["--help"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    assert "usage: cmd" in out and "--retry" in out and "--handler" in out


def argparse_parsers(path: Path) -> list[int]:
    """Lines where ``path`` makes a plain argparse.ArgumentParser."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if name == "ArgumentParser":
                found.append(node.lineno)
    return found


def test_every_command_and_script_parses_with_the_one_line_parser() -> None:
    assert len(COMMAND_SOURCES) > 40
    plain = {str(p.relative_to(ROOT)): argparse_parsers(p) for p in COMMAND_SOURCES}
    assert {path: lines for path, lines in plain.items() if lines} == {}


@pytest.mark.parametrize(
    "script",
    ["worker.py", "setup_topology.py", "dlq.py", "replay.py", "console.py", "publish.py"],
)
def test_a_script_refuses_an_unknown_option_in_one_line(script: str) -> None:
    result = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / script), "--no-such-option"],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": "/usr/bin:/bin"},
    )
    assert result.returncode == 2, result.stderr
    assert result.stderr == "error: unrecognized arguments: --no-such-option\n"
    assert result.stdout == ""
