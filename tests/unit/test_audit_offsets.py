"""The stream reader's offset store (atomic JSON file), --from parsing and gap arithmetic."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import pytest

from amqp_lab.audit import OffsetStore, ReaderKey, parse_start, removed_before
from amqp_lab.errors import ConfigurationError

pytestmark = pytest.mark.unit
KEY = ReaderKey("vh", "q:tasks:audit", "r1")


def test_offsets_are_kept_per_vhost_stream_and_name(tmp_path: Path) -> None:
    store = OffsetStore(tmp_path / "state" / "offsets.json")
    assert store.get(KEY) is None
    store.put(KEY, 41)
    store.put(ReaderKey("vh", "q:tasks:audit", "r2"), 7)
    store.put(ReaderKey("other", "q:tasks:audit", "r1"), 3)
    again = OffsetStore(tmp_path / "state" / "offsets.json")  # resume: a new process
    assert again.get(KEY) == 41
    assert again.get(ReaderKey("vh", "q:tasks:audit", "r2")) == 7
    assert again.get(ReaderKey("other", "q:tasks:audit", "r1")) == 3
    again.delete(KEY)
    assert again.get(KEY) is None and again.get(ReaderKey("vh", "q:tasks:audit", "r2")) == 7


def test_a_write_replaces_the_file_whole_and_leaves_no_temporary(tmp_path: Path) -> None:
    path = tmp_path / "offsets.json"
    store = OffsetStore(path)
    store.put(KEY, 1)
    inode = path.stat().st_ino
    store.put(KEY, 2)
    assert path.stat().st_ino != inode  # os.replace of a new file, never an in-place rewrite
    assert json.loads(path.read_text())["offsets"]["vh"]["q:tasks:audit"]["r1"]["offset"] == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["offsets.json", "offsets.json.lock"]


def test_a_failed_write_keeps_the_previous_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "offsets.json"
    store = OffsetStore(path)
    store.put(KEY, 5)

    def crash(*_: object) -> None:
        raise OSError("disk full")

    monkeypatch.setattr("os.replace", crash)
    with pytest.raises(ConfigurationError, match="disk full"):
        store.put(KEY, 6)
    assert OffsetStore(path).get(KEY) == 5
    assert sorted(p.name for p in tmp_path.iterdir()) == ["offsets.json", "offsets.json.lock"]


def test_an_unreadable_file_is_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "offsets.json"
    path.write_text("{not json")
    with pytest.raises(ConfigurationError, match=r"offsets\.json"):
        OffsetStore(path).get(KEY)


@pytest.mark.parametrize(
    ("text", "start"),
    [
        ("first", "first"),
        ("last", "last"),
        ("next", "next"),
        ("1234", 1234),
        ("2026-01-31T12:00:00Z", datetime(2026, 1, 31, 12, tzinfo=UTC)),
        ("2026-01-31T12:00:00", datetime(2026, 1, 31, 12, tzinfo=UTC)),
    ],
)
def test_from_values(text: str, start: object) -> None:
    assert parse_start(text) == start


def test_a_bad_from_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="--from"):
        parse_start("yesterday")


def test_the_gap_is_what_the_broker_skipped() -> None:
    assert removed_before(expected=10, first_delivered=10) == 0
    assert removed_before(expected=10, first_delivered=8) == 0
    assert removed_before(expected=10, first_delivered=250) == 240
