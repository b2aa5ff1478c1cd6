"""The library is the library: no module of amqp_lab imports the lab, the benchmarks, the
examples or the scripts, every public module says what it exports, and the data it needs is
inside the package (an installed wheel has nothing else)."""

from __future__ import annotations

import ast
import importlib
import importlib.util
import json
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


# Imports the libraries named in argv[1] (comma-separated), then each module in argv[2:] first,
# in a fork of itself: one line per module that failed, with the exception's last line.
FORKED_IMPORTS = """
import importlib, json, os, sys, traceback
for lib in filter(None, sys.argv[1].split(",")):
    try:
        importlib.import_module(lib)
    except ImportError:
        pass  # an optional extra: the module that needs it says so when imported
failed = []
for name in sys.argv[2:]:
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        try:
            importlib.import_module(name)
        except BaseException:
            os.write(write, traceback.format_exc().strip().splitlines()[-1].encode())
            os._exit(1)
        os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as r:
        error = r.read().decode()
    if os.waitpid(pid, 0)[1]:
        failed.append(f"{name}: {error}")
print(json.dumps(failed))  # the last line: what a module prints while imported comes before
"""


def first_import_failures(libraries: list[str], names: list[str], path: Path) -> list[str]:
    """Each of ``names`` imported first in a fork of an interpreter that has imported
    ``libraries`` only (with ``path`` first on sys.path); the modules that failed."""
    import subprocess
    import sys

    result = subprocess.run(
        [sys.executable, "-c", FORKED_IMPORTS, ",".join(libraries), *names],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=path,
    )
    assert result.returncode == 0, result.stderr
    failed: list[str] = json.loads(result.stdout.splitlines()[-1])
    return failed


def test_every_module_imports_first_in_a_fresh_interpreter() -> None:
    """No import cycle hides behind import order: each module is imported first, on its own, in
    a new interpreter (a cycle once broke only when a test imported the pipelined publisher
    before anything else). Each is a fork of one that has imported the third-party modules
    amqp_lab names (pika, httpx, psycopg, ...) and no amqp_lab module: a new interpreter per
    module paid their import each time, 43-71 s of CI's CPU-bound core stage."""
    import sys

    names = sorted({module_name(p) for p in MODULES})
    # the top-level packages only, and no standard library module: a module that uses a
    # submodule it does not import (``import concurrent``, then ``concurrent.futures``)
    # must fail here as it fails in a new interpreter
    libraries = sorted(
        {n.split(".")[0] for p in MODULES for n in imported_names(p)}
        - set(sys.stdlib_module_names)
        - {"amqp_lab"}
    )
    assert "pika" in libraries and "os" not in libraries
    assert first_import_failures(libraries, names, PACKAGE.parent) == []


def test_the_first_import_check_sees_a_cycle_one_import_order_hides(tmp_path: Path) -> None:
    """The check above can fail: ``a`` takes a name from ``b``, which imports ``a`` - fine
    when ``a`` comes first, as one process importing the package in order does; ``b`` first
    fails. Printing while imported does not disturb the result; the same package without the
    cycle passes."""
    (tmp_path / "cyc").mkdir()
    (tmp_path / "cyc" / "__init__.py").write_text("print('imported')\n")
    (tmp_path / "cyc" / "a.py").write_text("from cyc.b import B\nA = 1\n")
    (tmp_path / "cyc" / "b.py").write_text("import cyc.a\nB = 2\n")
    names = ["cyc", "cyc.a", "cyc.b"]
    failed = first_import_failures(["pika"], names, tmp_path)
    assert [line.split(":")[0] for line in failed] == ["cyc.b"]
    assert "partially initialized module" in failed[0]
    (tmp_path / "cyc" / "b.py").write_text("B = 2\n")
    assert first_import_failures(["pika"], names, tmp_path) == []


# --- layering: observability and dlq import nothing from the packages that use them ---------------
LOWER = ("observability", "dlq")
USERS = {  # the packages that use them (issue 23), whether or not they do today
    "observability": {"consuming", "publishing", "dlq", "cli", "console", "ordering", "exporters"},
    "dlq": {"consuming", "cli", "console", "ordering", "exporters", "outbox"},
}


def package_of(name: str) -> str | None:
    """``amqp_lab.X.y`` -> ``X`` (None outside amqp_lab or for a top-level module)."""
    parts = name.split(".")
    return parts[1] if parts[0] == "amqp_lab" and len(parts) > 2 else None


def package_imports() -> dict[str, set[str]]:
    """For each amqp_lab subpackage, the other subpackages its modules import."""
    graph: dict[str, set[str]] = {}
    for path in MODULES:
        owner = package_of(module_name(path) + ".x")
        if owner is None or path.parent == PACKAGE:
            continue
        used = {package_of(n + ".x") for n in imported_names(path)}
        graph.setdefault(owner, set()).update(p for p in used if p and p != owner)
    return graph


@pytest.mark.parametrize("lower", LOWER)
def test_a_lower_package_imports_nothing_from_the_packages_that_use_it(lower: str) -> None:
    graph = package_imports()
    users = USERS[lower] | {p for p, used in graph.items() if lower in used}
    assert users >= {"consuming", "cli"}  # the graph found the users
    upward = {
        f"{module_name(path)} imports {name}"
        for path in MODULES
        if module_name(path).startswith(f"amqp_lab.{lower}")
        for name in imported_names(path)
        if package_of(name + ".x") in users
    }
    assert upward == set()


def test_the_layering_check_sees_an_upward_import(tmp_path: Path) -> None:
    """The check above can fail: a module importing a user of its package is found."""
    module = tmp_path / "probe.py"
    module.write_text("from amqp_lab.consuming.delivery import DeliveryReport\n")
    assert package_of(next(iter(imported_names(module))) + ".x") == "consuming"


PURE_DLQ = ["record", "raw_record", "view", "summary", "fingerprint"]
IO_NAMES = ("pika", "httpx", "psycopg", "socket", "amqp_lab.connection", "amqp_lab.management")
IO_PACKAGES = ("amqp_lab.publishing", "amqp_lab.dlq.ops", "amqp_lab.dlq.window")


@pytest.mark.parametrize("name", PURE_DLQ)
def test_the_dlq_record_and_view_are_pure(name: str) -> None:
    """The pure record apart from the I/O: these read and build records, and import no broker,
    network or database code; the operations on the queue are dlq.ops and dlq.window."""
    imported = imported_names(PACKAGE / "dlq" / f"{name}.py")
    io = {n for n in imported if n.startswith(IO_NAMES) or n.startswith(IO_PACKAGES)}
    assert io == set()


def test_importing_the_dlq_record_loads_no_dlq_operation() -> None:
    import subprocess
    import sys

    probe = (
        "import sys, amqp_lab.dlq.record, amqp_lab.dlq.view;"
        "print(sorted(m for m in sys.modules if m in ('amqp_lab.dlq.ops', 'amqp_lab.dlq.window')))"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True
    )
    assert result.stdout.strip() == "[]"


def test_observability_is_instrumentation_and_the_exporters_export() -> None:
    """Prometheus (collectors, the HTTP server) is amqp_lab.exporters'; observability (what the
    library calls: tracing, logs, guards, outcome names) does not load it."""
    for path in (PACKAGE / "observability").glob("*.py"):
        assert not {n for n in imported_names(path) if n.startswith("prometheus_client")}, path
    exporting = set().union(*(imported_names(p) for p in (PACKAGE / "exporters").glob("*.py")))
    assert any(n.startswith("prometheus_client") for n in exporting)
