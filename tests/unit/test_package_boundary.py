"""The library is the library: no module of amqp_lab imports the lab, the benchmarks, the
examples or the scripts, every public module says what it exports, and the data it needs is
inside the package (an installed wheel has nothing else)."""

from __future__ import annotations

import ast
import importlib
import importlib.util
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

PACKAGE = Path(__file__).resolve().parents[2] / "amqp_lab"
OUTSIDE = ("lab", "benchmarks", "examples", "scripts", "tests", "_cli", "worker")
MODULES = sorted(PACKAGE.rglob("*.py"))


def imported_names(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def test_the_package_has_modules_to_check() -> None:
    assert len(MODULES) > 30  # the walk found the package, not an empty directory


@pytest.mark.parametrize("path", MODULES, ids=module_name)
def test_no_library_module_imports_the_lab(path: Path) -> None:
    outside = {n for n in imported_names(path) if n.split(".")[0] in OUTSIDE}
    assert outside == set()


@pytest.mark.parametrize(
    "path",
    [p for p in MODULES if not p.name.startswith("_") or p.name == "__init__.py"],
    ids=module_name,
)
def test_every_public_module_declares_all(path: Path) -> None:
    if path.name == "__init__.py" and not path.read_text().strip():
        pytest.skip("an empty package marker")
    module = importlib.import_module(module_name(path))
    exported = getattr(module, "__all__", None)
    assert isinstance(exported, list) and exported, f"{module.__name__} has no __all__"
    missing = [
        name
        for name in exported
        if not hasattr(module, name)
        and importlib.util.find_spec(f"{module.__name__}.{name}") is None  # or a submodule
    ]
    assert missing == []


def test_the_packaged_data_lives_in_the_package() -> None:
    from amqp_lab.topology import DEFAULT_TOPOLOGY

    assert DEFAULT_TOPOLOGY.is_relative_to(PACKAGE) and DEFAULT_TOPOLOGY.is_file()
    assert (PACKAGE / "py.typed").is_file()


def test_every_module_imports_first_in_a_fresh_interpreter() -> None:
    """No import cycle hides behind import order: each module is imported first, on its own, in
    a new interpreter (a cycle once broke only when a test imported the pipelined publisher
    before anything else)."""
    import subprocess
    import sys

    names = sorted({module_name(p) for p in MODULES})
    script = (
        "import subprocess, sys\n"
        "failed = []\n"
        "for name in sys.argv[1:]:\n"
        "    r = subprocess.run([sys.executable, '-c', f'import {name}'], capture_output=True,"
        " text=True)\n"
        "    if r.returncode:\n"
        "        failed.append(name + ': ' + r.stderr.strip().splitlines()[-1])\n"
        "print('\\n'.join(failed))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script, *names], capture_output=True, text=True, timeout=300
    )
    assert result.stdout.strip() == ""
