"""Shared plumbing of the command line: the environment, one-line errors, exit codes.

Only the command line reads environment variables: EAI_AMQP_URL (required; the vhost is its
path), EAI_MGMT_URL (optional; defaults to the AMQP host on port 15672 with the same
credentials), EAI_LOG_LEVEL and EAI_TRACEBACK. The library proper receives a BrokerSettings.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import logging
import os
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from amqp_lab.errors import AmqpLabError, ConfigurationError, error_text
from amqp_lab.gc_policy import DEFAULT_YOUNG_THRESHOLD, MAX_YOUNG_THRESHOLD
from amqp_lab.observability.logs import JsonFormatter, TextFormatter, json_line
from amqp_lab.oneline import one_line
from amqp_lab.settings import BrokerSettings, mask_url
from amqp_lab.topology import (
    DEFAULT_DELIVERY_LIMIT,
    DEFAULT_MAX_AGE,
    DEFAULT_MAX_LENGTH_BYTES,
    DEFAULT_MAX_SEGMENT_SIZE_BYTES,
    DEFAULT_TOPOLOGY,
    QUEUE_TYPES,
    QueueType,
    Topology,
    load_topology,
    with_queue_type,
    with_stream_audit,
)
from amqp_lab.topology.ordered import with_ordered

__all__ = [
    "EXIT_ALERT",
    "EXIT_CANNOT_RESTART",
    "EXIT_FAILED",
    "EXIT_OK",
    "EXIT_UNROUTABLE",
    "add_audit_option",
    "add_queue_type_option",
    "add_topology_option",
    "load_callable",
    "require_extra",
    "run",
    "settings_from_env",
    "topology_from",
]

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_ALERT = 2
EXIT_UNROUTABLE = 3
EXIT_CANNOT_RESTART = 4


def settings_from_env(connection_name: str, **overrides: object) -> BrokerSettings:
    """BrokerSettings from EAI_AMQP_URL / EAI_MGMT_URL; raises ConfigurationError if unset."""
    url = os.environ.get("EAI_AMQP_URL")
    if not url:
        raise ConfigurationError(
            "EAI_AMQP_URL is not set: set it to an amqp:// or amqps:// URL whose path is the vhost "
            '(or run: eval "$(python scripts/broker.py env)")'
        )
    return BrokerSettings(
        amqp_url=url,
        management_url=os.environ.get("EAI_MGMT_URL") or None,
        connection_name=connection_name,
        **overrides,  # type: ignore[arg-type]
    )


def run(main: Callable[[], int]) -> None:
    """Run ``main``; an AmqpLabError becomes one masked line on stderr and exit 1."""
    for stream in (sys.stdout, sys.stderr):  # a lone surrogate in a message must not crash us
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None:
            reconfigure(errors="backslashreplace")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(TextFormatter("%(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=os.environ.get("EAI_LOG_LEVEL", "WARNING"), handlers=[handler])
    # pika logs basic.return at WARNING and failed connection attempts with tracebacks at
    # ERROR; the scripts report both themselves, as one line each.
    logging.getLogger("pika").setLevel(logging.CRITICAL)
    # OpenTelemetry warns once per message whose tracestate is malformed: a hostile publisher
    # could flood the log; such a header is ignored (a new trace starts) either way.
    logging.getLogger("opentelemetry.trace.span").setLevel(logging.ERROR)
    try:
        code = main()
    except AmqpLabError as e:
        _error_line(mask_url(str(e)))
        code = EXIT_FAILED
    except KeyboardInterrupt:
        code = 130
    except Exception as e:  # a bug: still one line (EAI_TRACEBACK=1 shows the traceback)
        if os.environ.get("EAI_TRACEBACK"):
            raise
        text = " ".join(str(e).split())
        _error_line(f"unexpected {type(e).__name__}: {mask_url(text)}")
        code = EXIT_FAILED
    sys.exit(code)


def _error_line(text: str) -> None:
    """The one error line on stderr: ``error: TEXT``, or a JSON ``error`` event when the
    command logs JSON (``--log-format json``)."""
    if any(isinstance(h.formatter, JsonFormatter) for h in logging.getLogger().handlers):
        print(json_line("error", level="error", message=text), file=sys.stderr)
    else:
        print(f"error: {one_line(text)}", file=sys.stderr)


def add_topology_option(parser: argparse._ActionsContainer) -> None:
    """``--topology FILE``: the definitions file whose ``amqp_lab`` section names every queue
    and exchange the command uses (default: the topology amqp-lab ships)."""
    parser.add_argument(
        "--topology",
        default=str(DEFAULT_TOPOLOGY),
        metavar="FILE",
        help="definitions JSON naming the queues and exchanges (default: the packaged one)",
    )
    parser.add_argument(
        "--ordered",
        type=int,
        default=0,
        metavar="SHARDS",
        help="the ordered variant: per-key order over SHARDS shard queues with single active "
        "consumer behind a consistent-hash exchange (docs/ordering.md; default: off)",
    )


def add_gc_option(parser: argparse._ActionsContainer) -> None:
    """``--gc-young-threshold N``: the garbage collector's young threshold for a long-running
    command, with what is alive after start-up frozen (:mod:`amqp_lab.gc_policy`)."""
    parser.add_argument(
        "--gc-young-threshold",
        type=_young_threshold,
        default=DEFAULT_YOUNG_THRESHOLD,
        metavar="N",
        help=f"allocations between young garbage collections once started (default "
        f"{DEFAULT_YOUNG_THRESHOLD}, with what start-up left frozen; CPython's is 700; "
        "0: leave the collector as CPython sets it; docs/consuming.md)",
    )


def _young_threshold(text: str) -> int:
    try:
        value = int(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from e
    if not 0 <= value <= MAX_YOUNG_THRESHOLD:
        raise argparse.ArgumentTypeError(f"{value} is not within 0..{MAX_YOUNG_THRESHOLD}")
    return value


def add_queue_type_option(parser: argparse.ArgumentParser) -> None:
    """``--queue-type classic|quorum`` and ``--delivery-limit N``: the topology's queues as
    declared in the file, or their quorum variant (:func:`amqp_lab.topology.with_queue_type`)."""
    parser.add_argument(
        "--queue-type",
        choices=QUEUE_TYPES,
        default="classic",
        help="classic: the queues as the file declares them (default); quorum: replicated "
        "quorum queues with at-least-once dead-lettering (docs/topology.md)",
    )
    parser.add_argument(
        "--delivery-limit",
        type=int,
        default=DEFAULT_DELIVERY_LIMIT,
        metavar="N",
        help="quorum only: the work and wait queues' broker-side delivery limit "
        f"(default {DEFAULT_DELIVERY_LIMIT})",
    )


def add_audit_option(parser: argparse.ArgumentParser) -> None:
    """``--audit queue|stream`` with ``--audit-max-bytes``, ``--audit-max-age`` and
    ``--audit-segment-bytes``: the audit queue as the file declares it, or as a stream with
    retention (:func:`amqp_lab.topology.with_stream_audit`, docs/audit-stream.md)."""
    parser.add_argument(
        "--audit",
        choices=("queue", "stream"),
        default="queue",
        help="queue: the audit queue as the file declares it (default); stream: a stream "
        "with retention, read with scripts/audit.py (docs/audit-stream.md)",
    )
    parser.add_argument(
        "--audit-max-bytes",
        type=int,
        default=DEFAULT_MAX_LENGTH_BYTES,
        metavar="BYTES",
        help="stream only: retention by size, max-length-bytes by policy; the stream keeps up "
        f"to this plus one segment (default {DEFAULT_MAX_LENGTH_BYTES})",
    )
    parser.add_argument(
        "--audit-max-age",
        default=DEFAULT_MAX_AGE,
        metavar="AGE",
        help=f"stream only: retention by age, max-age by policy, e.g. 12h, 7D; 'none' for "
        f"size only (default {DEFAULT_MAX_AGE})",
    )
    parser.add_argument(
        "--audit-segment-bytes",
        type=int,
        default=DEFAULT_MAX_SEGMENT_SIZE_BYTES,
        metavar="BYTES",
        help="stream only: x-stream-max-segment-size-bytes, a declare argument: retention drops "
        f"whole segments (default {DEFAULT_MAX_SEGMENT_SIZE_BYTES})",
    )


def topology_from(args: argparse.Namespace) -> Topology:
    """The topology ``--topology`` names, of the ``--queue-type`` asked for and with the
    ``--audit`` variant when the command has those options, its ordered variant with
    ``--ordered SHARDS``; raises TopologyError (one line) when it is bad."""
    topology = load_topology(Path(args.topology))
    queue_type: QueueType = getattr(args, "queue_type", "classic")
    limit = getattr(args, "delivery_limit", DEFAULT_DELIVERY_LIMIT)
    shards = getattr(args, "ordered", 0)
    if shards:
        topology = with_ordered(topology, shards)
    topology = with_queue_type(topology, queue_type, limit)
    if getattr(args, "audit", "queue") == "stream":
        max_age = args.audit_max_age
        topology = with_stream_audit(
            topology,
            max_length_bytes=args.audit_max_bytes,
            max_age=None if max_age.lower() == "none" else max_age,
            max_segment_size_bytes=args.audit_segment_bytes,
        )
    return topology


def require_extra(module: str, extra: str, what: str) -> None:
    """Raise ConfigurationError - one line naming the extra to install - when ``module`` (the
    extra's package, e.g. ``flask`` for the ``console`` extra) cannot be imported, so that
    ``what`` needs it: ``pip install 'amqp-lab[EXTRA]'``."""
    try:
        found = importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        found = False
    if not found:
        raise ConfigurationError(
            f"{what} needs the {extra} extra ({module} is not installed): "
            f"pip install 'amqp-lab[{extra}]'"
        )


def load_callable(spec: str) -> Any:
    """``package.module:attribute`` (a handler, say) imported and returned, looked up like
    ``python -m`` does: the current directory first, then the installed packages. Raises
    ConfigurationError naming what is missing, or - for an error raised while the module is
    imported - its type, message, file and line. Whether the target can serve as a handler is
    :func:`amqp_lab.consuming.handler_contract.check_handler`'s question."""
    module_name, sep, attribute = spec.partition(":")
    if not sep or not module_name or not attribute:
        raise ConfigurationError(f"{spec!r}: expected package.module:function")
    here = os.getcwd()
    if here not in sys.path and "" not in sys.path:
        sys.path.insert(0, here)  # a console script's sys.path[0] is the venv's bin/
    try:
        module = importlib.import_module(module_name)
    except Exception as e:  # the module is missing, or it raised while importing: say where
        if isinstance(e, ModuleNotFoundError) and f"{module_name}.".startswith(f"{e.name}."):
            raise ConfigurationError(f"cannot import {module_name!r} for {spec!r}: {e}") from e
        raise ConfigurationError(
            f"importing {module_name!r} for {spec!r} failed at {_where(e)}: "
            f"{type(e).__name__}: {error_text(e, 500)}"
        ) from e
    target = module
    for part in attribute.split("."):
        if not hasattr(target, part):
            raise ConfigurationError(f"{module_name!r} has no {attribute!r}")
        target = getattr(target, part)
    return target


def _where(error: BaseException) -> str:
    """``file:line`` where ``error`` was raised: a SyntaxError's own position, else the last
    frame of its traceback."""
    if isinstance(error, SyntaxError) and error.filename:
        return f"{error.filename}:{error.lineno}"
    frames = traceback.extract_tb(error.__traceback__)
    return f"{frames[-1].filename}:{frames[-1].lineno}" if frames else "?"
