#!/usr/bin/env python3
"""Apply topology/definitions.json to the vhost of EAI_AMQP_URL (idempotent), or --verify it.

Exit 0: applied (or in sync); 1: an error (one line on stderr); 2: --verify found drift.
"""

from __future__ import annotations

import argparse

from _cli import EXIT_ALERT, EXIT_OK, run, settings_from_env

from amqp_lab.topology import DEFAULT_TOPOLOGY, apply_topology, load_topology, verify_topology


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--verify", action="store_true", help="compare live vhost with the data")
    parser.add_argument("--topology", default=str(DEFAULT_TOPOLOGY), help="definitions JSON")
    args = parser.parse_args()
    settings = settings_from_env("amqp-lab setup_topology")
    topology = load_topology(args.topology)
    if args.verify:
        drift = verify_topology(settings, topology)
        for line in drift:
            print(f"drift: {line}")
        if drift:
            return EXIT_ALERT
        print(f"vhost {settings.vhost!r}: topology in sync ({settings.masked_url})")
        return EXIT_OK
    report = apply_topology(settings, topology)
    for name in report.created:
        print(f"created {name}")
    print(
        f"vhost {settings.vhost!r}: {len(report.created)} created, "
        f"{len(report.unchanged)} unchanged ({settings.masked_url})"
    )
    return EXIT_OK


if __name__ == "__main__":
    run(main)
