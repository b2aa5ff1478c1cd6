"""The topology files amqp-lab ships, and the variants derived from the default in code.

The repository keeps them in its top-level ``topology/`` folder; the wheel carries the same
files as package data in ``amqp_lab/topology/data/`` (:data:`~amqp_lab.topology.load.DATA`),
copied there by ``scripts/topology_files.py`` and checked identical by a test:

* ``definitions.json``: the default topology (:data:`~amqp_lab.topology.load.DEFAULT_TOPOLOGY`),
  edited by hand;
* ``quorum.json`` and ``ordered.json``: its quorum and ordered variants, generated from it by
  :func:`~amqp_lab.topology.queue_type.with_queue_type` and
  :func:`~amqp_lab.topology.ordered.with_ordered` (:data:`VARIANTS`, :func:`variant_text`):
  the same topologies ``--queue-type quorum`` and ``--ordered 4`` give, written down;
* ``invoices.json``: the topology of the example application (``examples/invoices``).

:func:`packaged` names one of them in the installed package.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from amqp_lab.topology.export import render_definitions
from amqp_lab.topology.load import DATA
from amqp_lab.topology.model import Topology
from amqp_lab.topology.ordered import DEFAULT_SHARDS, with_ordered
from amqp_lab.topology.queue_type import with_queue_type

__all__ = ["FILES", "VARIANTS", "packaged", "variant_text"]

VARIANTS: dict[str, tuple[str, Callable[[Topology], Topology]]] = {
    "quorum.json": (
        "the default topology with quorum queues: with_queue_type(definitions, 'quorum'), "
        "what --queue-type quorum applies",
        lambda topology: with_queue_type(topology, "quorum"),
    ),
    "ordered.json": (
        f"the default topology's ordered variant: with_ordered(definitions, {DEFAULT_SHARDS}), "
        f"what --ordered {DEFAULT_SHARDS} applies",
        lambda topology: with_ordered(topology, DEFAULT_SHARDS),
    ),
}
"""Each generated file's name: (what it is, how it is derived from ``definitions.json``)."""
FILES = ("definitions.json", *VARIANTS, "invoices.json")
"""Every topology file shipped, top-level ``topology/`` and package data alike."""


def variant_text(name: str, default: Topology) -> str:
    """The text of generated file ``name`` (a key of :data:`VARIANTS`) for the ``default``
    topology. Raises KeyError for another name."""
    what, derive = VARIANTS[name]
    comment = (
        f"Generated from definitions.json by scripts/topology_files.py - do not edit: edit "
        f"definitions.json and run that script. This is {what} (docs/topology.md)."
    )
    return render_definitions(derive(default), comment)


def packaged(name: str) -> Path:
    """The installed copy of topology file ``name`` (one of :data:`FILES`)."""
    if name not in FILES:
        raise KeyError(f"no packaged topology {name!r}: choose one of {', '.join(FILES)}")
    return DATA / name
