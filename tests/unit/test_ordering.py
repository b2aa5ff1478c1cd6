"""Per-key ordering, pure parts: the ordered topology variant, message keys, the key lines."""

from __future__ import annotations

from contextlib import closing
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from amqp_lab.dedup import SqliteDedupStore
from amqp_lab.errors import ConfigurationError, TopologyError
from amqp_lab.message import KEY_HEADER, message_for
from amqp_lab.ordering import KeyLines, OrderedConfig
from amqp_lab.ordering.parking import ENCODED, TABLE, ParkedKeys, read_back, stored
from amqp_lab.topology import load_topology, with_queue_type
from amqp_lab.topology.ordered import HASH_EXCHANGE_TYPE, is_ordered, with_ordered

pytestmark = pytest.mark.unit


def test_the_ordered_variant_adds_hash_exchange_shards_and_their_policy() -> None:
    base = load_topology()
    topology = with_ordered(base, shards=3, weight=7)
    names = topology.names
    assert is_ordered(topology) and not is_ordered(base)
    assert names.exchange == "tasks.ordered" and names.routing_key == ""
    assert names.shard_queues == ("q:tasks:shard:1", "q:tasks:shard:2", "q:tasks:shard:3")
    types = {e.name: e.type for e in topology.exchanges}
    assert types["tasks.ordered"] == "fanout"
    assert types["tasks.ordered.shards"] == HASH_EXCHANGE_TYPE
    for shard in names.shard_queues:
        assert dict(topology.queue(shard).arguments) == {"x-single-active-consumer": True}
        policy = topology.policy_for(shard)
        assert policy is not None and policy.name == "q-tasks-dlx-shards"
        assert policy.definition_dict["dead-letter-exchange"] == "tasks.dlx"
    bindings = {
        (b.source, b.destination, b.destination_type, b.routing_key) for b in topology.bindings
    }
    assert ("tasks.ordered", "tasks.ordered.shards", "exchange", "") in bindings
    assert ("tasks.ordered", "q:tasks:audit", "queue", "") in bindings
    assert ("tasks.ordered.shards", "q:tasks:shard:2", "queue", "7") in bindings
    assert set(base.queues) <= set(topology.queues)  # the plain variant stays


def test_the_ordered_variant_composes_with_quorum_either_way() -> None:
    one = with_queue_type(with_ordered(load_topology(), 2), "quorum")
    other = with_ordered(with_queue_type(load_topology(), "quorum"), 2)
    for topology in (one, other):
        arguments = dict(topology.queue("q:tasks:shard:1").arguments)
        assert arguments == {"x-queue-type": "quorum", "x-single-active-consumer": True}
    assert one.queues == other.queues


@pytest.mark.parametrize(("shards", "weight"), [(0, 20), (1001, 20), (4, 0)])
def test_bad_shard_counts_and_weights_are_refused(shards: int, weight: int) -> None:
    with pytest.raises(TopologyError):
        with_ordered(load_topology(), shards, weight)


def test_ordering_twice_is_refused() -> None:
    with pytest.raises(TopologyError, match="ordered already"):
        with_ordered(with_ordered(load_topology()))


def test_a_key_is_the_routing_key_and_a_header() -> None:
    names = with_ordered(load_topology()).names
    message = message_for(names, {"n": 1}, key="order-7")
    assert message.routing_key == "order-7" and message.headers[KEY_HEADER] == "order-7"
    assert message.exchange == "tasks.ordered"
    with pytest.raises(ConfigurationError, match="routes by key"):
        message_for(names, {"n": 1})
    for bad in ("", "k" * 256, "é" * 128):
        with pytest.raises(ConfigurationError, match=r"1\.\.255 bytes"):
            message_for(names, {"n": 1}, key=bad)
    plain = message_for(load_topology().names, {"n": 1}, key="k")  # plain topology: allowed
    assert plain.routing_key == "k"


def test_the_ordered_consumer_needs_the_ordered_topology() -> None:
    with pytest.raises(ConfigurationError, match="ordered topology"):
        OrderedConfig(load_topology().names)
    with pytest.raises(ConfigurationError):
        OrderedConfig(with_ordered(load_topology()).names, prefetch=0)


def test_a_line_runs_its_head_only_and_the_others_wait() -> None:
    lines: KeyLines[str] = KeyLines()
    assert lines.arrive("a", "a1") is True
    assert lines.arrive("a", "a2") is False
    assert lines.arrive("b", "b1") is True
    assert len(lines) == 3
    assert lines.fail("a", due=10.0) == 1
    assert lines.due(5.0) == [] and lines.next_due() == 10.0
    assert lines.due(10.0) == ["a"] and lines.next_due() is None
    assert lines.head("a") == "a1" and lines.failures("a") == 1
    assert lines.done("a") == "a2" and lines.failures("a") == 0
    assert lines.done("a") is None and "a" not in lines
    assert lines.take_all("b") == ["b1"] and len(lines) == 0


@given(st.lists(st.tuples(st.sampled_from("abcd"), st.booleans()), max_size=60))
def test_every_key_settles_in_arrival_order(events: list[tuple[str, bool]]) -> None:
    """Whatever fails and when, each key's items leave their line in arrival order."""
    lines: KeyLines[int] = KeyLines()
    runnable: list[str] = []
    for n, (key, _) in enumerate(events):
        if lines.arrive(key, n):
            runnable.append(key)
    settled: list[tuple[str, int]] = []
    failures = iter([fail for _, fail in events] * 3)
    clock = 0.0
    while runnable or len(lines):
        if not runnable:
            clock += 1.0
            runnable.extend(lines.due(clock))
            continue
        key = runnable.pop(0)
        if next(failures, False) and lines.failures(key) < 2:
            lines.fail(key, clock + 1.0)
            continue
        settled.append((key, lines.head(key)))
        if lines.done(key) is not None:
            runnable.append(key)
    for key in "abcd":
        mine = [n for k, n in settled if k == key]
        assert mine == sorted(mine) == [n for n, (k, _) in enumerate(events) if k == key]


texts = st.text(st.characters(blacklist_categories=["Cs"]))  # what PostgreSQL text can be given


@given(a=texts, b=texts)
def test_a_parked_key_is_stored_without_nul_one_form_per_text_and_read_back(a: str, b: str) -> None:
    assert "\x00" not in stored(a)
    assert read_back(stored(a)) == a
    assert (stored(a) == stored(b)) == (a == b)


@pytest.mark.parametrize(
    ("text", "kept"),
    [("a", True), ("key-1", True), ("", True), ("a\x00b", False), (ENCODED + "x", False)],
)
def test_only_a_text_with_a_nul_or_the_mark_is_stored_in_its_json_form(
    text: str, kept: bool
) -> None:
    """Keys parked by an earlier version (stored as themselves) are still found."""
    assert (stored(text) == text) is kept
    assert read_back(stored(text)) == text
    assert read_back(ENCODED + "not json") == ENCODED + "not json"


def test_keys_holding_a_nul_park_and_release_whichever_form_they_were_stored_in(
    tmp_path: Path,
) -> None:
    """A key parked by an earlier version, as itself (SQLite holds a NUL), is still found,
    kept and released; one parked now round-trips through its JSON form."""
    with closing(SqliteDedupStore(tmp_path / "d.sqlite3")) as store:
        parked = ParkedKeys(store, "scope")
        assert parked.all() == []  # the table made
        store.run_in_transaction(
            lambda db: db.execute(
                f"INSERT INTO {TABLE} (scope, key, message_id, parked_at) VALUES (?, ?, ?, ?)",
                ("scope", "old\x00key", "m-\x00", 1.0),
            )
        )
        parked.park("new\x00key", "n-\x00", 2.0)
        parked.park("old\x00key", "later", 3.0)  # parked already: keeps its first blocker
        assert [(p.key, p.message_id) for p in parked.all()] == [
            ("old\x00key", "m-\x00"),
            ("new\x00key", "n-\x00"),
        ]
        assert (parked.blocker("old\x00key"), parked.blocker("new\x00key")) == ("m-\x00", "n-\x00")
        parked.release("old\x00key")
        parked.release("new\x00key")
        assert parked.all() == []
