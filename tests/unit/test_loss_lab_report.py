"""lab.loss_lab.report: the loss table as text, Markdown and JSON (pure)."""

from __future__ import annotations

import json

import pytest

from lab.loss_lab.catalog import DESIGNS
from lab.loss_lab.report import COLUMNS, Row, from_json, human_bytes, markdown, text_table, to_json

pytestmark = pytest.mark.unit


def row(key: str = "brpop", **kw: object) -> Row:
    values: dict[str, object] = {
        "key": key,
        "design": DESIGNS[key].title,
        "published": 100,
        "lost": 3,
        "twice": 0,
        "effects": 97,
        "recovery": DESIGNS[key].recovery,
        "memory_bytes": 26_606_800.0,
        "memory_note": "MEMORY USAGE",
    }
    values.update(kw)
    return Row(**values)  # type: ignore[arg-type]


def test_human_bytes() -> None:
    assert [human_bytes(v) for v in (None, 12, 1_500, 26_606_800, 2e9)] == [
        "n/a",
        "12 B",
        "1.5 kB",
        "26.6 MB",
        "2.0 GB",
    ]


def test_markdown_has_a_header_a_separator_and_one_line_per_row() -> None:
    rows = [row(), row("xstream-maxlen", lost=75, trimmed=75, maxlen="MAXLEN ~ 25")]
    text = markdown(rows, ["N = 100"])
    lines = text.splitlines()
    assert lines[0] == "| " + " | ".join(COLUMNS) + " |"
    assert lines[1] == "|---|---|---|---|---|---|"
    assert lines[2].startswith("| 1. Redis list LPUSH/BRPOP | 3 | 0 | none: the pop")
    assert "| 75 (75 trimmed) | 0 |" in lines[3] and lines[3].endswith("| MAXLEN ~ 25 |")
    assert "26.6 MB (MEMORY USAGE)" in lines[2]
    assert lines[4:] == ["", "N = 100"]


def test_a_pipe_in_a_cell_is_escaped() -> None:
    line = markdown([row(recovery="a | b")]).splitlines()[2]
    assert "a \\| b" in line and line.count(" | ") == len(COLUMNS) - 1


def test_text_table_aligns_and_cuts_long_cells() -> None:
    text = text_table([row(), row("dedup", lost=0, memory_bytes=None, memory_note="")], width=20)
    lines = text.splitlines()
    assert lines[0].startswith("design") and set(lines[1]) <= {"-", " "}
    assert len({line.index("lost") for line in lines[:1]}) == 1
    assert "n/a" in lines[3] and "..." in lines[2]
    assert lines[2].index("3") == lines[0].index("lost")  # the lost column lines up


def test_json_round_trips_rows_and_parameters() -> None:
    rows = [row(), row("stream", lost=0, twice=4, extra={"left_after_drain": 0})]
    text = to_json(rows, {"messages": 100, "kills": 2})
    assert json.loads(text)["rows"][1]["twice"] == 4
    assert from_json(text) == (rows, {"messages": 100, "kills": 2})


def test_every_design_says_how_it_recovers() -> None:
    assert list(DESIGNS) == [
        "brpop",
        "lmove",
        "xstream",
        "xstream-maxlen",
        "autoack",
        "manual",
        "dedup",
        "stream",
    ]
    assert all(spec.recovery and spec.family in ("redis", "rabbit") for spec in DESIGNS.values())


def test_messages_left_in_the_queue_after_the_drain_are_named_beside_the_lost() -> None:
    text = markdown([row(lost=3, extra={"left_after_drain": 3}), row(lost=0)])
    assert "3 (3 still in the queue when the drain gave up)" in text
    assert "still in the queue" not in text.splitlines()[3]
