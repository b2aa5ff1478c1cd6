"""The loss table (pure): one :class:`Row` per design, rendered as aligned text, Markdown and
JSON. No I/O here: the runner measures, this module only formats."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

COLUMNS = (
    "design",
    "lost",
    "processed twice",
    "how a crash is recovered",
    "memory per 100k kept",
    "MAXLEN",
)


@dataclass(frozen=True)
class Row:
    """One design's measured result. ``published``: ids published; ``lost``: published ids with
    no effect; ``twice``: ids with more than one effect; ``effects``: effect rows in all;
    ``trimmed``: ids the design itself dropped (MAXLEN); ``memory_bytes``: bytes per 100k
    messages kept (None: not measurable), ``memory_note`` how it was read; ``maxlen``: the
    bound, or "none"; ``kills``: SIGKILLs of the worker."""

    key: str
    design: str
    published: int
    lost: int
    twice: int
    effects: int
    recovery: str
    memory_bytes: float | None
    memory_note: str
    maxlen: str = "none"
    trimmed: int = 0
    kills: int = 0
    extra: dict[str, Any] = field(default_factory=dict)


def human_bytes(value: float | None) -> str:
    """``12.3 MB`` style (decimal units); "n/a" for None."""
    if value is None:
        return "n/a"
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if value >= size:
            return f"{value / size:.1f} {unit}"
    return f"{value:.0f} B"


def cells(row: Row) -> list[str]:
    """The row's cells in :data:`COLUMNS` order."""
    memory = human_bytes(row.memory_bytes)
    if row.memory_note:
        memory += f" ({row.memory_note})"
    lost = str(row.lost) + (f" ({row.trimmed} trimmed)" if row.trimmed else "")
    left = row.extra.get("left_after_drain") or 0
    if isinstance(left, int) and left > 0:  # not applied, but not gone either: say so
        lost += f" ({left} still in the queue when the drain gave up)"
    return [row.design, lost, str(row.twice), row.recovery, memory, row.maxlen]


def markdown(rows: list[Row], footnotes: list[str] | None = None) -> str:
    """A GitHub Markdown table of ``rows``, then each footnote as its own paragraph. A ``|`` in
    a cell is escaped."""
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for row in rows:
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells(row)) + " |")
    for note in footnotes or []:
        lines += ["", note]
    return "\n".join(lines) + "\n"


def text_table(rows: list[Row], width: int = 60) -> str:
    """Aligned plain text for the terminal; cells longer than ``width`` are cut with "..."."""
    table = [list(COLUMNS)] + [cells(row) for row in rows]
    table = [[c if len(c) <= width else c[: width - 3] + "..." for c in r] for r in table]
    sizes = [max(len(r[i]) for r in table) for i in range(len(COLUMNS))]
    out = ["  ".join(c.ljust(sizes[i]) for i, c in enumerate(r)).rstrip() for r in table]
    out.insert(1, "  ".join("-" * s for s in sizes))
    return "\n".join(out) + "\n"


def to_json(rows: list[Row], parameters: dict[str, Any]) -> str:
    """``{"parameters": ..., "rows": [...]}``, indented, keys in field order."""
    return json.dumps({"parameters": parameters, "rows": [asdict(r) for r in rows]}, indent=2)


def from_json(text: str) -> tuple[list[Row], dict[str, Any]]:
    """The inverse of :func:`to_json`: (rows, parameters)."""
    data = json.loads(text)
    return [Row(**r) for r in data["rows"]], dict(data["parameters"])
