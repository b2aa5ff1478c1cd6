"""amqp_lab.frame_reader: the consumer's frame loop against pika's own, on the same bytes.

Two stand-in connections made of pika's own ``Connection`` methods (the frame loop, callback
processing, frame dispatch): one keeps pika's ``_on_data_available``, the other gets
:func:`amqp_lab.frame_reader.install`. Fed the same frames, cut into the same reads, both must
deliver the same frames to the same channels in the same order, run the same callbacks, leave
the same buffer and count the same frames and bytes - or raise the same error.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

import pika
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pika import frame, spec
from pika.callback import CallbackManager
from pika.connection import Connection
from pika.exceptions import InvalidFrameError

from amqp_lab import frame_reader, wire

pytestmark = pytest.mark.unit


class StandIn:
    """What pika's frame loop touches of a Connection, with pika's own methods; channel frames
    and heartbeats are recorded instead of handled."""

    _on_data_available = Connection._on_data_available
    _read_frame = Connection._read_frame
    _trim_frame_buffer = Connection._trim_frame_buffer
    _process_frame = Connection._process_frame
    _process_callbacks = Connection._process_callbacks
    _is_method_frame = Connection._is_method_frame
    _has_pending_callbacks = Connection._has_pending_callbacks

    def __init__(self, waited: frozenset[tuple[int, str]] = frozenset()) -> None:
        self._frame_buffer = b""
        self.bytes_received = self.frames_received = 0
        self.callbacks = CallbackManager()
        self.seen: list[tuple[str, Any]] = []
        self._heartbeat_checker = self
        for channel, name in sorted(waited):
            self.callbacks.add(channel, name, self._callback)

    def _callback(self, value: Any) -> None:
        self.seen.append(("callback", describe(value)))
        if isinstance(value.method, spec.Connection.Close | spec.Basic.Cancel):
            # what ending the stream does to pika's state (pika does it later, from the I/O
            # loop; a loop must still stop reading a buffer that was reset under it)
            self._frame_buffer = b""

    def received(self) -> None:  # the heartbeat checker
        self.seen.append(("heartbeat", None))

    def _deliver_frame_to_channel(self, value: Any) -> None:
        self.seen.append(("channel", describe(value)))
        if isinstance(value, frame.Body) and value.fragment.startswith(b"!"):
            raise ValueError("a channel refused the frame")  # e.g. UnexpectedFrameError


def describe(value: Any) -> tuple[Any, ...]:
    """A frame as comparable values."""
    if isinstance(value, frame.Method):
        return ("method", value.channel_number, value.method.NAME, repr(vars(value.method)))
    if isinstance(value, frame.Header):
        p = value.properties
        return ("header", value.channel_number, value.body_size, p.message_id, p.headers)
    if isinstance(value, frame.Body):
        return ("body", value.channel_number, value.fragment)
    return (type(value).__name__,)


def deliver(channel: int, tag: int) -> bytes:
    method = spec.Basic.Deliver("ctag", tag, tag % 2 == 0, "ex", f"rk.{tag}")
    return bytes(frame.Method(channel, method).marshal())


def content(channel: int, tag: int, body: bytes) -> bytes:
    properties = wire.AmqpProperties(
        message_id=f"m-{tag}", delivery_mode=2, headers={"attempts": tag % 3, "n": 1.5}
    )
    header = frame.Header(channel, len(body), properties).marshal()
    return bytes(header + frame.Body(channel, body).marshal())


FRAMES: dict[str, Callable[[int], bytes]] = {
    "delivery": lambda t: deliver(1, t) + content(1, t, b"x" * (t % 300)),
    "delivery_channel_2": lambda t: deliver(2, t) + content(2, t, b"{}"),
    "empty_body": lambda t: deliver(1, t) + frame.Header(1, 0, wire.AmqpProperties()).marshal(),
    "not_utf8": lambda t: (
        bytes(frame.Method(1, spec.Basic.Deliver(b"c\xff", t, True, b"\xfe", b"r\xc3")).marshal())
        + content(1, t, b"\xff")
    ),
    "refused": lambda t: deliver(1, t) + content(1, t, b"!" * 3),
    "heartbeat": lambda t: frame.Heartbeat().marshal(),
    "cancel": lambda t: frame.Method(1, spec.Basic.Cancel(f"c{t}")).marshal(),
    "ack": lambda t: frame.Method(1, spec.Basic.Ack(t, False)).marshal(),
    "channel_0": lambda t: frame.Method(0, spec.Connection.Blocked("low")).marshal(),
    "close": lambda t: frame.Method(0, spec.Connection.Close(320, "bye", 0, 0)).marshal(),
}
WAITED = st.frozensets(
    st.sampled_from(
        [(1, "Basic.Deliver"), (1, "Basic.Cancel"), (0, "Connection.Close"), (2, "Basic.Ack")]
    )
)


def feed(connection: Any, data: bytes, cuts: list[int], wording: bool = True) -> list[Any]:
    """Feed ``data`` in reads cut at ``cuts``, going on after an error as pika's transport
    would not (to compare the state an error leaves); each read's error, if any."""
    bounds = [0, *sorted(c % (len(data) + 1) for c in cuts), len(data)]
    errors: list[Any] = []
    for start, end in itertools.pairwise(bounds):
        if end > start:
            try:
                connection._on_data_available(data[start:end])
            except Exception as e:
                errors.append((type(e).__name__, str(e)) if wording else type(e).__name__)
                continue
            errors.append(None)
    return errors


def state(connection: Any) -> tuple[Any, ...]:
    return (
        connection.seen,
        connection._frame_buffer,
        connection.bytes_received,
        connection.frames_received,
    )


def ours(waited: frozenset[tuple[int, str]]) -> StandIn:
    connection = StandIn(waited)
    frame_reader.install(connection)
    return connection


@given(
    kinds=st.lists(st.sampled_from(sorted(FRAMES)), max_size=40),
    cuts=st.lists(st.integers(min_value=0, max_value=100_000), max_size=12),
    waited=WAITED,
)
def test_the_same_frames_go_to_the_same_places_as_with_pikas_loop(
    kinds: list[str], cuts: list[int], waited: frozenset[tuple[int, str]]
) -> None:
    data = b"".join(FRAMES[kind](tag) for tag, kind in enumerate(kinds))
    theirs, mine = StandIn(waited), ours(waited)
    assert feed(mine, data, cuts) == feed(theirs, data, cuts)
    assert state(mine) == state(theirs)


@settings(max_examples=500)
@given(
    kinds=st.lists(
        st.sampled_from(["delivery", "not_utf8", "refused", "ack", "heartbeat"]),
        min_size=1,
        max_size=10,
    ),
    flip=st.integers(min_value=0, max_value=10_000),
    cuts=st.lists(st.integers(min_value=0, max_value=10_000), max_size=4),
)
def test_damaged_bytes_raise_what_pika_raises(kinds: list[str], flip: int, cuts: list[int]) -> None:
    data = bytearray(b"".join(FRAMES[kind](tag) for tag, kind in enumerate(kinds)))
    data[flip % len(data)] ^= 0xFF
    theirs, mine = StandIn(), ours(frozenset())
    # the same error type (its wording may differ), and the same state after it
    assert feed(mine, bytes(data), cuts, False) == feed(theirs, bytes(data), cuts, False)
    assert state(mine) == state(theirs)


def test_a_wrong_frame_end_marker_raises_invalid_frame_error() -> None:
    data = bytearray(FRAMES["delivery"](1))
    data[len(deliver(1, 1)) - 1] = 0
    with pytest.raises(InvalidFrameError, match="FRAME_END"):
        ours(frozenset())._on_data_available(bytes(data))


def test_a_delivery_split_at_every_byte_arrives_whole_once() -> None:
    data = FRAMES["delivery"](7) + FRAMES["delivery"](8)
    for cut in range(1, len(data)):
        mine = ours(frozenset())
        mine._on_data_available(data[:cut])
        mine._on_data_available(data[cut:])
        assert [kind for kind, _ in mine.seen] == ["channel"] * 6
        assert [value[3] for _, value in mine.seen if value[0] == "header"] == ["m-7", "m-8"]
        assert (mine._frame_buffer, mine.frames_received) == (b"", 6)
        assert mine.bytes_received == len(data)


def test_install_replaces_the_loop_of_the_connection_under_a_blocking_one() -> None:
    impl = StandIn()

    class Blocking:
        _impl = impl

    frame_reader.install(Blocking())
    assert isinstance(impl.__dict__["_on_data_available"], frame_reader._FrameLoop)
    assert "_on_data_available" not in vars(StandIn())  # only that one connection
    assert pika.spec.props[60] is wire.AmqpProperties  # headers decoded losslessly
