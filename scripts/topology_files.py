#!/usr/bin/env python3
"""Write the generated topology files and the package's copies: topology/quorum.json and
topology/ordered.json from topology/definitions.json (amqp_lab.topology.files.VARIANTS), then
every file of topology/ into amqp_lab/topology/data/ (the copies the wheel ships).

    python scripts/topology_files.py           # write what is out of date, one line each
    python scripts/topology_files.py --check   # change nothing; exit 1 naming what is stale

Run it after editing topology/definitions.json or topology/invoices.json; the unit test
tests/unit/test_topology_files.py fails until then. Exit 0 when everything is up to date.
"""

from __future__ import annotations

from pathlib import Path

from _cli import EXIT_FAILED, EXIT_OK, ROOT, run

from amqp_lab.cli.parser import CommandParser
from amqp_lab.topology.files import FILES, VARIANTS, variant_text
from amqp_lab.topology.load import load_topology

TOPOLOGY = ROOT / "topology"
DATA = ROOT / "amqp_lab" / "topology" / "data"  # this checkout's package data


def wanted() -> dict[Path, str]:
    """Every file this script maintains, with the text it must have."""
    default = load_topology(TOPOLOGY / "definitions.json")
    texts = {name: variant_text(name, default) for name in VARIANTS}
    for name in FILES:
        if name not in texts:
            texts[name] = (TOPOLOGY / name).read_text(encoding="utf-8")
    files = {TOPOLOGY / name: texts[name] for name in VARIANTS}
    files.update({DATA / name: texts[name] for name in FILES})
    return files


def main() -> int:
    parser = CommandParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 if stale")
    args = parser.parse_args()
    stale = [
        path
        for path, text in wanted().items()
        if not path.exists() or path.read_text(encoding="utf-8") != text
    ]
    extra = sorted(set(DATA.glob("*.json")) - {DATA / name for name in FILES})
    for path in stale:
        print(f"{'stale' if args.check else 'wrote'} {path.relative_to(ROOT)}")
        if not args.check:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(wanted()[path], encoding="utf-8")
    for path in extra:
        print(f"{'extra' if args.check else 'removed'} {path.relative_to(ROOT)}")
        if not args.check:
            path.unlink()
    if args.check and (stale or extra):
        print("run: python scripts/topology_files.py")
        return EXIT_FAILED
    if not stale and not extra:
        print("topology files up to date")
    return EXIT_OK


if __name__ == "__main__":
    run(main)
