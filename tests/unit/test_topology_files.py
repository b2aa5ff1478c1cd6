"""The top-level topology/ folder and the package's copies (amqp_lab/topology/data, what the
wheel ships) are the same files, and the generated variants are what the code derives from
definitions.json today (scripts/topology_files.py writes them)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from amqp_lab.topology import DEFAULT_TOPOLOGY, load_topology, with_queue_type
from amqp_lab.topology.export import definitions_of, render_definitions
from amqp_lab.topology.files import FILES, VARIANTS, packaged, variant_text
from amqp_lab.topology.load import DATA, topology_from_definitions
from amqp_lab.topology.ordered import with_ordered

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
TOPOLOGY = ROOT / "topology"


def test_the_top_level_folder_holds_the_files_and_the_package_the_same_set() -> None:
    assert sorted(p.name for p in TOPOLOGY.glob("*.json")) == sorted(FILES)
    assert sorted(p.name for p in DATA.glob("*.json")) == sorted(FILES)
    assert set(FILES) >= {"definitions.json", "quorum.json", "ordered.json", "invoices.json"}


@pytest.mark.parametrize("name", FILES)
def test_the_packaged_copy_is_identical_to_the_top_level_one(name: str) -> None:
    assert packaged(name).read_bytes() == (TOPOLOGY / name).read_bytes(), (
        f"amqp_lab/topology/data/{name} differs from topology/{name}: run "
        "python scripts/topology_files.py"
    )


def test_the_default_topology_is_the_packaged_definitions() -> None:
    assert packaged("definitions.json") == DEFAULT_TOPOLOGY
    assert load_topology() == load_topology(TOPOLOGY / "definitions.json")


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_a_variant_file_is_what_the_code_derives_from_definitions(name: str) -> None:
    default = load_topology(TOPOLOGY / "definitions.json")
    assert (TOPOLOGY / name).read_text() == variant_text(name, default), (
        f"topology/{name} is stale: run python scripts/topology_files.py"
    )


def test_the_variants_load_back_equal_to_the_derived_topologies() -> None:
    default = load_topology()
    assert load_topology(packaged("quorum.json")) == with_queue_type(default, "quorum")
    ordered = load_topology(packaged("ordered.json"))
    assert ordered == with_ordered(default)
    assert ordered.names.shard_queues == tuple(f"q:tasks:shard:{n}" for n in range(1, 5))


@pytest.mark.parametrize("name", FILES)
def test_render_then_load_gives_the_same_topology(name: str, tmp_path: Path) -> None:
    topology = load_topology(packaged(name))
    path = tmp_path / name
    path.write_text(render_definitions(topology, "again"))
    assert load_topology(path) == topology
    assert topology_from_definitions(definitions_of(topology)) == topology


def test_packaged_refuses_an_unknown_name() -> None:
    with pytest.raises(KeyError, match=r"no packaged topology 'nope\.json'"):
        packaged("nope.json")


def test_the_sync_script_finds_nothing_stale() -> None:
    result = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "topology_files.py"), "--check"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (result.returncode, result.stdout) == (0, "topology files up to date\n"), result


def test_the_sync_script_names_a_stale_copy(tmp_path: Path) -> None:
    """--check on a copy of the repository's topology files with one edited."""
    copy = tmp_path / "repo"
    (copy / "scripts").mkdir(parents=True)
    for name in ("topology_files.py", "_cli.py"):
        (copy / "scripts" / name).write_text((ROOT / "scripts" / name).read_text())
    (copy / "topology").mkdir()
    for name in FILES:
        (copy / "topology" / name).write_bytes((TOPOLOGY / name).read_bytes())
    data = json.loads((copy / "topology" / "definitions.json").read_text())
    data["amqp_lab"]["wait_queues"] = 8
    (copy / "topology" / "definitions.json").write_text(json.dumps(data))
    result = subprocess.run(
        [sys.executable, str(copy / "scripts" / "topology_files.py"), "--check"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 1, result.stderr
    assert "stale topology/quorum.json" in result.stdout
    assert "stale topology/ordered.json" in result.stdout
