"""The bench's record of measured runs (benchmarks/history.jsonl): one JSON object per line -
the commit, the date, the broker's version, the settings and the figures - and the change of
a run against the last recorded one (``bench.py --compare``)."""

from __future__ import annotations

import json
import subprocess
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from amqp_lab.connection import close_quietly, connect
from amqp_lab.settings import BrokerSettings

__all__ = ["HISTORY", "KEYS", "broker_version", "load_history", "print_comparison", "record"]

HISTORY = Path(__file__).resolve().parent / "history.jsonl"
KEYS = (
    "publisher_vs_fire_and_forget",
    "publisher_vs_sync_confirms",
    "consumer_vs_auto_ack",
    "our_consumer_msg_s",
    "raw_auto_ack_consume_msg_s",
    "latency_p50_ms",
    "latency_p99_ms",
    "peak_rss_mb",
)
"""The figures a record keeps and a comparison shows."""
_SETTINGS = (
    "queue_type",
    "messages",
    "repeat",
    "batch",
    "window",
    "concurrency",
    "metrics",
    "gc_young_threshold",
)


def broker_version(settings: BrokerSettings) -> str:
    """The RabbitMQ version the broker announces in connection.start (no management API
    needed); "?" when it cannot be read."""
    connection = None
    try:
        connection = connect(settings)
        version = connection._impl.server_properties.get("version", "?")
        return version.decode() if isinstance(version, bytes) else str(version)
    except Exception:
        return "?"
    finally:
        close_quietly(connection)


def _commit() -> str:
    try:
        out = subprocess.run(
            ["git", "-C", str(HISTORY.parent), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
        )
        dirty = subprocess.run(
            # from the repository's root: "amqp_lab" is a path relative to -C's directory
            ["git", "-C", str(HISTORY.parents[1]), "status", "--porcelain", "--", "amqp_lab"],
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "?"
    return out.stdout.strip() + ("+changes" if dirty else "") if out.returncode == 0 else "?"


def load_history(path: Path) -> list[dict[str, Any]]:
    """The recorded runs, oldest first; lines that are not JSON objects are skipped."""
    if not path.exists():
        return []
    runs = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            run = json.loads(line)
        except ValueError:
            continue
        if isinstance(run, dict):
            runs.append(run)
    return runs


def record(path: Path, summary: dict[str, Any], note: str = "") -> dict[str, Any]:
    """Append this run to ``path``: commit, UTC date, broker version, settings, figures."""
    entry = {
        "commit": _commit(),
        "date": datetime.now(UTC).isoformat(timespec="seconds").replace("+00:00", "Z"),
        "broker_version": summary.get("broker_version", "?"),
        **{key: summary.get(key) for key in _SETTINGS},
        **{key: summary.get(key) for key in KEYS},
        "latency_p99_ms_range": summary.get("latency_p99_ms_range"),
        "consumer_vs_auto_ack_range": summary.get("consumer_vs_auto_ack_range"),
    }
    if note:
        entry["note"] = note
    with path.open("a", encoding="utf-8") as out:
        out.write(json.dumps(entry, allow_nan=False) + "\n")
    return entry


def print_comparison(summary: dict[str, Any], history: list[dict[str, Any]]) -> None:
    """The change of each figure against the last recorded run with the same broker version
    and settings (else the last one, saying so)."""
    alike = ("broker_version", "queue_type", "concurrency", "metrics", "gc_young_threshold")
    same = [run for run in history if all(run.get(k) == summary.get(k) for k in alike)]
    if not history:
        print("no recorded run to compare with")
        return
    last = (same or history)[-1]
    print(
        f"against {last.get('commit')} of {last.get('date')} (RabbitMQ "
        f"{last.get('broker_version')}"
        + ("" if same else "; other settings or broker: the last run of any kind")
        + ")"
    )
    for key in KEYS:
        before, now = last.get(key), summary.get(key)
        if isinstance(before, int | float) and isinstance(now, int | float) and before:
            print(f"  {key:32} {before:>10} -> {now:<10} ({(now - before) / before:+.0%})")
