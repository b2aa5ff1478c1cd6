"""Apply a topology's definitions file to the vhost of EAI_AMQP_URL (idempotent), or --verify it.

Exit 0: applied (or in sync); 1: an error (one line on stderr); 2: --verify found drift.
"""

from __future__ import annotations

from amqp_lab.cli.common import (
    EXIT_ALERT,
    EXIT_OK,
    add_audit_option,
    add_queue_type_option,
    add_topology_option,
    run,
    settings_from_env,
    topology_from,
)
from amqp_lab.cli.parser import CommandParser
from amqp_lab.topology import Topology, apply_topology, is_stream, queue_type_of, verify_topology

__all__ = ["entry", "main"]


def main(argv: list[str] | None = None) -> int:
    """The topology command (exit code returned): apply the ``--topology`` file's exchanges,
    queues, bindings and policies through the management API, or compare them (``--verify``).
    Raises AmqpLabError subclasses (ManagementError, TopologyError...) for :func:`run`."""
    parser = CommandParser(description=__doc__.splitlines()[0])
    parser.add_argument("--verify", action="store_true", help="compare live vhost with the data")
    add_topology_option(parser)
    add_queue_type_option(parser)
    add_audit_option(parser)
    args = parser.parse_args(argv)
    topology = topology_from(args)
    settings = settings_from_env("amqp-lab setup_topology")
    if args.verify:
        drift = verify_topology(settings, topology)
        for line in drift:
            print(f"drift: {line}")
        if drift:
            return EXIT_ALERT
        print(
            f"vhost {settings.vhost!r}: {_kind(topology)} topology in sync ({settings.masked_url})"
        )
        return EXIT_OK
    report = apply_topology(settings, topology)
    for name in report.created:
        print(f"created {name}")
    print(
        f"vhost {settings.vhost!r}: {_kind(topology)} topology, "
        f"{len(report.created)} created, "
        f"{len(report.unchanged)} unchanged ({settings.masked_url})"
    )
    return EXIT_OK


def _kind(topology: Topology) -> str:
    """``classic`` / ``quorum``, with ``, stream audit`` when the audit queue is a stream."""
    audit = topology.named.audit_queue if topology.named is not None else None
    stream = audit is not None and is_stream(topology.queue(audit))
    return queue_type_of(topology) + (" (stream audit)" if stream else "")


def entry() -> None:
    """The ``amqp-lab-topology`` console script."""
    run(main)
