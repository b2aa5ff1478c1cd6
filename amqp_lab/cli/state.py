"""Where the command line keeps state by default: the SQLite dedup store per broker and vhost
(``worker.py``, ``dedup.py``, ``keys.py parked``), and the DLQ audit log
(:func:`default_audit_log`: ``amqp-lab-replay`` and the DLQ console).

The file is ``<state_dir>/dedup-<state key>.sqlite3`` (:func:`amqp_lab.state_key.state_key`:
a readable slug and a hash of the exact broker identity and vhost), so vhosts ``a/b`` and
``a_b`` get two files. amqp-lab 0.2 named it ``dedup-<host>-<port>-<vhost>.sqlite3`` with
every character other than letters, digits, ``_ . -`` replaced by ``_``: that name is still
used where it can belong to this vhost only (it has no ``_``), and refused, with what to do,
where it could belong to another vhost too (docs/dedup.md#the-default-store-file).
"""

from __future__ import annotations

from pathlib import Path

from amqp_lab.dlq.audit_log import DEFAULT_AUDIT_LOG
from amqp_lab.errors import ConfigurationError
from amqp_lab.settings import BrokerSettings
from amqp_lab.state_key import legacy_state_key, state_key

__all__ = ["STATE_DIR", "default_audit_log", "default_dedup_path", "legacy_dedup_path"]

STATE_DIR = Path(".state")
"""The state directory, relative to the current directory: beside the app that runs the
command (the installed commands' default; the repository's scripts pass the checkout's)."""


def default_audit_log(state_dir: Path = STATE_DIR) -> Path:
    """The DLQ audit log's default path: ``<state_dir>/replay-audit.jsonl``
    (:data:`~amqp_lab.dlq.audit_log.DEFAULT_AUDIT_LOG`), ``state_dir`` relative to the
    current directory unless absolute - wherever the package is installed."""
    return state_dir / DEFAULT_AUDIT_LOG.name


def legacy_dedup_path(settings: BrokerSettings, state_dir: Path) -> Path:
    """The file amqp-lab 0.2 used for ``settings``' broker and vhost (lossy name)."""
    return state_dir / f"dedup-{legacy_state_key(settings)}.sqlite3"


def default_dedup_path(settings: BrokerSettings, state_dir: Path) -> str:
    """The default SQLite store of ``settings``' broker and vhost in ``state_dir``: one file
    per (broker, vhost), so fresh vhosts start fresh and two vhosts never share one.

    When only an amqp-lab 0.2 file exists for the pair, it is returned if its name can stand
    for this vhost alone (no ``_`` in it, so no other vhost mapped to it); otherwise
    ConfigurationError says, in one line, to rename it (it holds this vhost's claims) or move
    it away (it does not) - a store picked by guess could ack another vhost's messages as
    duplicates, and a fresh one could apply this vhost's again."""
    path = state_dir / f"dedup-{state_key(settings)}.sqlite3"
    legacy = legacy_dedup_path(settings, state_dir)
    if path.exists() or not legacy.exists():
        return str(path)
    if "_" not in legacy.name.removesuffix(".sqlite3"):
        return str(legacy)
    raise ConfigurationError(
        f"{legacy} is an amqp-lab 0.2 dedup store whose name cannot tell vhost "
        f"{settings.vhost!r} from others (every unsafe character became '_'): if it holds "
        f"this vhost's claims, stop its workers and rename it (with any -wal and -shm files) "
        f"to {path}; if not, move it away or give --dedup-path (docs/dedup.md)"
    )
