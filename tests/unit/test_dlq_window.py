"""The bounded DLQ pass against a model of a queue (basic.get from the head, publish to the
tail, basic.nack requeue back to the place - a classic queue - or to the tail - a quorum queue
of RabbitMQ 3.10 / 4.0): the window bounds what is held, the records left keep their order on
both, arrivals are not examined, a dry run moves nothing; and exact copies."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from decimal import Decimal
from types import SimpleNamespace
from typing import Any

import pika
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from amqp_lab.dlq import window as window_module
from amqp_lab.dlq.ops import replay
from amqp_lab.dlq.summary import Selection
from amqp_lab.dlq.window import Action, DlqPass, Held, exact_properties, window_for_rate
from amqp_lab.errors import ConfigurationError, MessageNacked, ReplayStopped
from amqp_lab.fieldtable import encode_table
from amqp_lab.settings import BrokerSettings
from amqp_lab.wire import AmqpProperties

pytestmark = pytest.mark.unit
SETTINGS = BrokerSettings("amqp://app:pw@localhost:5672/vh")


@dataclass
class ModelQueue:
    """A channel on one queue, as far as a pass uses it."""

    ready: deque[tuple[str, Any]] = field(default_factory=deque)
    unacked: dict[int, tuple[int, tuple[str, Any]]] = field(default_factory=dict)
    arrivals: list[str] = field(default_factory=list)  # published by others, one per basic.get
    tag: int = 0
    position: int = 0
    max_unacked: int = 0
    is_open: bool = True
    requeue_to_tail: bool = False  # a quorum queue of RabbitMQ 3.10 or 4.0

    def add(self, name: str, user_id: str | None = None) -> None:
        props = pika.BasicProperties(message_id=name, user_id=user_id, headers={"key": name[0]})
        self.ready.append((name, props))

    def names(self) -> list[str]:
        return [name for name, _ in self.ready]

    def basic_get(self, queue: str, auto_ack: bool) -> tuple[Any, Any, bytes]:
        if self.arrivals:
            self.add(self.arrivals.pop(0))
        if not self.ready:
            return None, None, b""
        message = self.ready.popleft()
        self.tag += 1
        self.position += 1
        self.unacked[self.tag] = (self.position, message)
        self.max_unacked = max(self.max_unacked, len(self.unacked))
        return SimpleNamespace(delivery_tag=self.tag), message[1], message[0].encode()

    def basic_ack(self, tag: int) -> None:
        del self.unacked[tag]

    def basic_nack(self, tag: int, multiple: bool, requeue: bool) -> None:
        assert (tag, multiple, requeue) == (0, True, True)
        back = [message for _, message in sorted(self.unacked.values(), key=lambda m: m[0])]
        self.unacked.clear()
        if self.requeue_to_tail:
            self.ready.extend(back)
        else:
            self.ready.extendleft(reversed(back))

    def basic_publish(self, exchange: str, key: str, body: bytes, props: Any, **kw: Any) -> None:
        assert (exchange, kw) == ("", {"mandatory": True}) and isinstance(props, AmqpProperties)
        self.ready.append((body.decode(), props))

    def confirm_delivery(self) -> None:
        pass

    @property
    def connection(self) -> ModelQueue:
        return self

    def process_data_events(self, time_limit: float) -> None:
        pass

    def queue_declare(self, queue: str, passive: bool) -> Any:
        return SimpleNamespace(method=SimpleNamespace(message_count=len(self.ready)))


@pytest.fixture
def model(monkeypatch: pytest.MonkeyPatch) -> ModelQueue:
    queue = ModelQueue()

    @contextmanager
    def open_channel(settings: BrokerSettings) -> Iterator[ModelQueue]:
        yield queue

    monkeypatch.setattr(window_module, "open_channel", open_channel)
    return queue


def acker(selected: set[str], log: list[str], seen: list[str] | None = None) -> Any:
    def act(channel: Any, item: Held, deadline: float) -> Action:
        if seen is not None:
            seen.append(str(item.entry.message_id))
        if item.entry.message_id not in selected:
            return "keep"
        channel.basic_ack(item.delivery_tag)
        log.append(str(item.entry.message_id))
        return "done"

    return act


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.booleans(), min_size=0, max_size=40),
    st.integers(1, 12),
    st.one_of(st.none(), st.integers(1, 10)),
    st.integers(0, 5),
    st.booleans(),
)
def test_a_pass_holds_a_window_and_keeps_the_order_of_what_it_leaves(
    chosen: list[bool], window: int, limit: int | None, arriving: int, quorum: bool
) -> None:
    """Whatever the selection, window, --limit, arrivals and queue type: at most ``window``
    held, the selected ones done in DLQ order, every original not done still there once and in
    order, arrivals not examined; nothing moved when the DLQ fit one window and got nothing."""
    model = ModelQueue(requeue_to_tail=quorum)
    names = [f"{'s' if pick else 'n'}{i:02d}" for i, pick in enumerate(chosen)]
    for name in names:
        model.add(name)
    model.arrivals = [f"a{i}" for i in range(arriving)]
    done: list[str] = []
    seen: list[str] = []
    selected = {name for name in names if name.startswith("s")}
    dlq_pass = DlqPass(SETTINGS, "q", window=window)
    with pytest.MonkeyPatch.context() as patch:

        @contextmanager
        def open_channel(settings: BrokerSettings) -> Iterator[ModelQueue]:
            yield model

        patch.setattr(window_module, "open_channel", open_channel)
        report = dlq_pass.run(
            acker(selected, done, seen), lambda: limit is not None and len(done) >= limit
        )
    for name in model.arrivals:  # those the pass did not wait for arrive after it
        model.add(name)
    assert not [name for name in seen if name.startswith("a")]  # arrivals: not examined
    wanted = [name for name in names if name in selected][:limit]
    assert done == wanted
    assert model.max_unacked <= window and report.max_unacked <= window
    assert not model.unacked
    left = model.names()
    originals = [name for name in left if not name.startswith("a")]
    assert originals == [name for name in names if name not in done]  # once each, in order
    assert sorted(name for name in left if name.startswith("a")) == model_arrivals(arriving)
    if len(names) <= window and not arriving:
        assert report.moved == 0 and left == originals
    assert report.removed == len(done) and report.depth == len(names)


def model_arrivals(count: int) -> list[str]:
    return sorted(f"a{i}" for i in range(count))


def test_a_dry_run_reads_one_window_and_moves_nothing(model: ModelQueue) -> None:
    for i in range(10):
        model.add(f"s{i}")
    seen: list[str] = []

    def look(channel: Any, item: Held, deadline: float) -> Action:
        seen.append(str(item.entry.message_id))
        return "keep"

    report = DlqPass(SETTINGS, "q", window=4, may_move=False).run(look)
    assert seen == ["s0", "s1", "s2", "s3"] and not report.complete
    assert model.names() == [f"s{i}" for i in range(10)] and report.moved == 0


def test_a_window_not_settled_in_time_stops_the_pass_and_loses_nothing(
    model: ModelQueue,
) -> None:
    for name in ("n0", "s1", "s2", "n3", "s4", "s5"):
        model.add(name)
    ticks = iter(range(1000))  # each reading of the clock: one second later

    def slow(channel: Any, item: Held, deadline: float) -> Action:
        if str(item.entry.message_id).startswith("n"):
            return "keep"
        channel.basic_ack(item.delivery_tag)
        return "done"

    dlq_pass = DlqPass(SETTINGS, "q", window=5, max_hold=4, clock=lambda: float(next(ticks)))
    with pytest.raises(ReplayStopped, match="within 4 s"):
        dlq_pass.run(slow)
    # n3 and s4 were not reached in time: put back; n0 was moved: the DLQ is rotated
    assert model.names() == ["n3", "s4", "s5", "n0"] and not model.unacked
    assert dlq_pass.report.removed == 2 and dlq_pass.report.moved == 1


def test_a_record_of_another_user_stops_a_pass_that_must_move_it(model: ModelQueue) -> None:
    for i in range(3):
        model.add(f"n{i}", user_id="someone")
    model.add("s3")
    with pytest.raises(ReplayStopped, match="user_id 'someone'"):
        DlqPass(SETTINGS, "q", window=2).run(acker({"s3"}, []))
    assert model.names() == ["n0", "n1", "n2", "s3"]  # put back, in place
    assert not model.unacked


def test_the_window_shrinks_to_what_a_slow_rate_settles_in_time() -> None:
    assert window_for_rate(100, 60, None) == 100
    assert window_for_rate(100, 60, 20) == 100
    assert window_for_rate(100, 60, 0.5) == 15  # 15 waits of 2 s: half of the 60 s
    assert window_for_rate(100, 60, 0.001) == 1


def test_an_exact_copy_encodes_to_the_same_bytes() -> None:
    headers = {
        "x-death": [{"count": 1, "reason": "rejected", "queue": "q:tasks", "time": 1700000000}],
        "price": Decimal("1.25"),
        "ratio": 0.5,
        "raw": b"\x00\xff",
        "nested": {"a": [1, "b", None, True]},
    }
    original = AmqpProperties(
        content_type="application/json",
        headers=headers,
        delivery_mode=2,
        message_id="m-1",
        timestamp=1700000000,
        type="dlq-record",
        app_id="app",
        priority=3,
    )
    wire = b"".join(original.encode())
    received = AmqpProperties().decode(wire)
    assert b"".join(exact_properties(received).encode()) == wire
    assert encode_table(received.headers) == encode_table(headers)


def test_a_header_table_that_cannot_be_decoded_is_copied_as_it_came() -> None:
    bad = b"\x00\x00\x00\x05\x01kZzz"  # a field of unknown type 'Z'
    props = AmqpProperties(content_type="text/plain", content_encoding="gzip", message_id="m")
    flags, rest = props.encode()
    flag_word = int.from_bytes(flags, "big") | 0x2000
    offset = 1 + len("text/plain") + 1 + len("gzip")
    wire = flag_word.to_bytes(2, "big") + rest[:offset] + bad + rest[offset:]
    received = AmqpProperties().decode(wire)
    assert received.headers is None and received.undecodable_headers == bad
    assert b"".join(exact_properties(received).encode()) == wire


def test_a_rate_slower_than_the_hold_bound_allows_is_refused_before_connecting() -> None:
    nowhere = BrokerSettings("amqp://u:p@127.0.0.1:1/vh")
    with pytest.raises(ConfigurationError, match=r"waits 100 s between replays.*0\.0333"):
        replay(nowhere, lambda e: True, queue="q", rate=0.01)


class FakePublisher:
    """Publisher's stand-in: records what is published; a message_id in ``refuse`` fails."""

    sent: list[str]
    refuse: set[str]

    def __init__(self, settings: BrokerSettings) -> None:
        pass

    def __enter__(self) -> FakePublisher:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def publish(self, message: Any) -> None:
        if message.message_id in FakePublisher.refuse:
            raise MessageNacked("nacked by the broker once", message.message_id)
        FakePublisher.sent.append(message.message_id)


def test_a_key_replay_stops_at_its_first_failure_and_keeps_the_rest_in_order(
    model: ModelQueue, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("a0", "b1", "a2", "a3", "b4"):  # key = first letter
        model.add(name)
    FakePublisher.sent, FakePublisher.refuse = [], {"a2"}
    monkeypatch.setattr("amqp_lab.dlq.ops.Publisher", FakePublisher)
    results = replay(SETTINGS, Selection(key="a").matches, queue="q", window=2, in_order=True)
    assert [(r.entry.message_id, r.status) for r in results] == [
        ("a0", "replayed"),
        ("a2", "failed"),
        ("a3", "failed"),
    ]
    assert "earlier selected record failed" in results[2].detail
    assert FakePublisher.sent == ["a0"]
    assert model.names() == ["b1", "a2", "a3", "b4"]  # moved round, in their order
