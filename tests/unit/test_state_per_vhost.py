"""State per broker and vhost never collides: the lossless state key, the default dedup store
path (and amqp-lab 0.2's files), a store bound to one vhost, offsets kept per broker."""

from __future__ import annotations

import json
import re
import sqlite3
from contextlib import closing
from pathlib import Path
from urllib.parse import quote

import pytest
from hypothesis import given
from hypothesis import strategies as st

from amqp_lab.audit import OffsetStore, ReaderKey
from amqp_lab.cli.state import default_dedup_path, legacy_dedup_path
from amqp_lab.dedup import open_store
from amqp_lab.dedup.identity import bind_vhost, bound_vhost, check_vhost
from amqp_lab.errors import ConfigurationError, StoreVhostMismatch
from amqp_lab.settings import BrokerSettings
from amqp_lab.state_key import SLUG_CHARS, broker_identity, state_key

pytestmark = pytest.mark.unit
SAFE = re.compile(r"[A-Za-z0-9_.+-]+-[0-9a-f]{12}")


def at(vhost: str, hosts: str = "127.0.0.1:5672") -> BrokerSettings:
    """Settings for ``vhost`` (any string) on the comma-separated ``hosts``."""
    path = quote(vhost, safe="")
    return BrokerSettings(",".join(f"amqp://u:secret@{h}/{path}" for h in hosts.split(",")))


def test_vhosts_a_lossy_name_merged_get_keys_of_their_own() -> None:
    vhosts = ["a/b", "a_b", "a b", "a%2Fb", "a//b", "/", "_", "A/b"]
    keys = {state_key(at(v)) for v in vhosts}
    assert len(keys) == len(vhosts)
    assert all(SAFE.fullmatch(k) for k in keys)
    assert state_key(at("a/b")).startswith("127.0.0.1-5672-a_b-")  # readable beside the hash


def test_a_cluster_is_one_broker_whatever_the_order_of_its_nodes() -> None:
    one = at("vh", "rmq1:5672,rmq2:5672,RMQ3:5672")
    other = at("vh", "rmq3:5672,rmq1:5672,rmq2:5672")
    assert broker_identity(one) == broker_identity(other) == "rmq1:5672,rmq2:5672,rmq3:5672"
    assert state_key(one) == state_key(other)
    assert state_key(one).startswith("rmq1-5672+2-vh-")
    assert state_key(at("vh", "rmq1:5672,rmq2:5672")) != state_key(one)  # other nodes
    assert state_key(at("vh", "rmq1:5673")) != state_key(at("vh", "rmq1:5672"))
    assert broker_identity(at("vh", "[::1]:5672")) == "[::1]:5672"
    assert "secret" not in broker_identity(one)


@given(st.text(min_size=1, max_size=300), st.text(min_size=1, max_size=300))
def test_any_two_vhosts_get_two_safe_bounded_keys(first: str, second: str) -> None:
    one, two = state_key(at(first)), state_key(at(second))
    assert SAFE.fullmatch(one) and len(one) <= SLUG_CHARS + 13
    assert (one == two) == (at(first).vhost == at(second).vhost)


def test_the_default_store_path_is_per_broker_and_vhost(tmp_path: Path) -> None:
    paths = {default_dedup_path(at(v), tmp_path) for v in ("a/b", "a_b")}
    paths.add(default_dedup_path(at("a/b", "other:5672"), tmp_path))
    assert len(paths) == 3
    assert all(Path(p).parent == tmp_path and p.endswith(".sqlite3") for p in paths)


def test_an_old_file_is_kept_where_its_name_stands_for_this_vhost_alone(tmp_path: Path) -> None:
    settings = at("prod")
    old = legacy_dedup_path(settings, tmp_path)
    assert old.name == "dedup-127.0.0.1-5672-prod.sqlite3"
    old.touch()
    assert default_dedup_path(settings, tmp_path) == str(old)


def test_an_old_file_that_could_be_another_vhosts_is_refused_in_one_line(tmp_path: Path) -> None:
    settings = at("a/b")
    old = legacy_dedup_path(settings, tmp_path)
    assert old == legacy_dedup_path(at("a_b"), tmp_path)  # the collision this fixes
    old.touch()
    with pytest.raises(ConfigurationError) as refused:
        default_dedup_path(settings, tmp_path)
    text = str(refused.value)
    new = tmp_path / f"dedup-{state_key(settings)}.sqlite3"
    assert "\n" not in text and str(old) in text and str(new) in text and "'a/b'" in text
    new.touch()  # renamed, or a new one made: the new file wins from then on
    assert default_dedup_path(settings, tmp_path) == str(new)


def test_a_store_serves_the_first_vhost_that_opens_it(tmp_path: Path) -> None:
    with closing(open_store(tmp_path / "d.sqlite3")) as store:
        assert bound_vhost(store) is None
        check_vhost(store, "x")  # not bound yet: nothing to refuse, nothing bound
        assert bound_vhost(store) is None
        bind_vhost(store, "a/b", "h:5672", clock=lambda: 5.0)
        bind_vhost(store, "a/b", "other:5672")  # the same vhost from another node: fine
        assert bound_vhost(store) == ("a/b", "h:5672")
        for refuse in (bind_vhost, check_vhost):
            with pytest.raises(StoreVhostMismatch) as refused:
                refuse(store, "a_b")
            text = str(refused.value)
            assert "\n" not in text and str(tmp_path / "d.sqlite3") in text
            assert "'a/b'" in text and "'a_b'" in text


def test_a_store_from_before_the_check_keeps_its_claims_and_is_bound(tmp_path: Path) -> None:
    path = tmp_path / "old.sqlite3"
    with closing(sqlite3.connect(path)) as db:  # amqp-lab 0.2's schema, with one claim
        db.execute("CREATE TABLE processed (message_id TEXT PRIMARY KEY, processed_at REAL)")
        db.execute("INSERT INTO processed VALUES ('m-1', 1.0)")
        db.commit()
    with closing(open_store(path)) as store:
        bind_vhost(store, "vh")
        assert store.is_processed("m-1") and bound_vhost(store) == ("vh", "")
    with closing(open_store(path)) as store, pytest.raises(StoreVhostMismatch):
        bind_vhost(store, "other")


def test_a_store_of_your_own_is_not_checked() -> None:
    class Mine:
        def is_processed(self, message_id: str) -> bool:
            return False

    bind_vhost(Mine(), "a")
    check_vhost(Mine(), "b")
    assert bound_vhost(Mine()) is None


def test_offsets_are_kept_per_broker(tmp_path: Path) -> None:
    store = OffsetStore(tmp_path / "offsets.json")
    one = ReaderKey("vh", "q:tasks:audit", "r", broker="rmq1:5672")
    two = ReaderKey("vh", "q:tasks:audit", "r", broker="other:5672")
    store.put(one, 41)
    assert store.get(one) == 41 and store.get(two) is None
    store.put(two, 3)
    assert (store.get(one), store.get(two)) == (41, 3)
    store.delete(one)
    assert (store.get(one), store.get(two)) == (None, 3)


def test_an_offset_without_a_broker_is_read_then_moved_under_the_first_writer(
    tmp_path: Path,
) -> None:
    path = tmp_path / "offsets.json"
    old = {"offsets": {"vh": {"q:tasks:audit": {"r": {"offset": 9, "updated_at": "x"}}}}}
    path.write_text(json.dumps(old))
    store = OffsetStore(path)
    one = ReaderKey("vh", "q:tasks:audit", "r", broker="rmq1:5672")
    two = ReaderKey("vh", "q:tasks:audit", "r", broker="other:5672")
    assert store.get(one) == 9  # the reader resumes where amqp-lab 0.2 left it
    store.put(one, 12)
    assert (store.get(one), store.get(two)) == (12, None)  # moved: not shared any more
    data = json.loads(path.read_text())
    assert data["offsets"]["vh"]["q:tasks:audit"] == {}
    assert data["brokers"]["rmq1:5672"]["vh"]["q:tasks:audit"]["r"]["offset"] == 12


def test_odd_offset_files_read_as_no_offset(tmp_path: Path) -> None:
    path = tmp_path / "offsets.json"
    key = ReaderKey("vh", "s", "r", broker="b:1")
    for text in ('{"brokers": 3}', '{"brokers": {"b:1": {"vh": {"s": {"r": 5}}}}}'):
        path.write_text(text)
        assert OffsetStore(path).get(key) is None
    path.write_text('{"brokers": {"b:1": {"vh": {"s": {"r": {"offset": true}}}}}}')
    assert OffsetStore(path).get(key) is None
