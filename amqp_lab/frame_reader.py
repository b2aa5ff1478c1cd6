"""A cheaper inbound frame loop for a consumer's connection (pika's frames, pika's dispatch).

pika 1.4.4's ``Connection._on_data_available`` pays two costs per frame that a consumer at
tens of thousands of deliveries a second feels (measured with py-spy on the bench's consumer:
about a tenth of its CPU, docs/benchmarks.md):

* it re-slices the whole remaining read buffer after every frame (``_trim_frame_buffer``): a
  read of 4 KiB holds about ten deliveries, thirty frames, and each one copies what is left
  (fixed upstream by pika/pika#1653, merged 2026-07-19, in no release yet);
* for every method frame it asks the ``CallbackManager`` whether a callback waits for it
  (``callbacks.pending``), whose argument sanitizing raises and catches a TypeError twice per
  call - for each ``basic.deliver``, which no pika callback ever waits for.

:func:`install` replaces that loop on one connection. Frames are still decoded by pika's own
``frame.decode_frame`` - but for ``basic.deliver``, content header and body frames, read here
the way pika reads them (the header's properties by the class pika's ``spec.props`` holds:
:class:`amqp_lab.wire.AmqpProperties`) - and every frame goes where pika sends it:

* a content header or body frame, and a ``basic.deliver`` no callback waits for, on a channel
  other than 0: straight to its channel (what ``_process_frame`` does for them once its checks
  come out empty);
* any other frame on a channel other than 0 (``channel.close``, ``basic.cancel``, an RPC
  reply, a ``basic.deliver`` a callback waits for): pika's own ``_process_frame``, with the
  buffer handed back to pika first and read back after, so a buffer pika replaced meanwhile
  is the one read on;
* a heartbeat, any frame on channel 0, anything that is no frame of those three types: pika's
  whole ``_on_data_available`` takes it and the rest of that read.

A frame pika cannot decode raises what pika raises (``InvalidFrameError`` for a wrong end
marker, ``struct.error`` for a short payload...), with the buffer and the frame counters as
pika leaves them; the transport then ends the connection. A property test
(``tests/unit/test_frame_reader.py``) compares both loops on random frames and reads.
"""

from __future__ import annotations

import struct
from typing import Any

from pika import frame, spec
from pika.data import decode_short_string
from pika.exceptions import InvalidFrameError

__all__ = ["install"]

_FRAME_HEADER = struct.Struct(">BHL")  # type, channel, payload size
_CONTENT_HEADER = struct.Struct(">HHQ")  # class id, weight, body size
_PAYLOAD = spec.FRAME_HEADER_SIZE  # 7: where a frame's payload starts
_OVERHEAD = spec.FRAME_HEADER_SIZE + spec.FRAME_END_SIZE  # 8
_PROPERTIES = _PAYLOAD + _CONTENT_HEADER.size  # 19: where a content header's flags start
_CHANNEL_FRAMES = (spec.FRAME_METHOD, spec.FRAME_HEADER, spec.FRAME_BODY)
_METHOD_ID = struct.Struct(">I")
_TAG_AND_BITS = struct.Struct(">QB")  # basic.deliver's delivery-tag and redelivered bit
_BASIC = spec.Basic.INDEX  # 60
_DELIVER = spec.Basic.Deliver


def install(connection: Any) -> None:
    """Give ``connection`` (a pika BlockingConnection, or the pika ``Connection`` under one)
    the frame loop of this module. Call it once the connection is open; it lasts as long as
    that connection. Only for a connection whose channel dispatch never reads the socket
    itself (pika's own adapters: a BlockingChannel only queues what arrives): the frames of
    a read already dispatched stay in the buffer until the loop ends, so a dispatch that read
    more at once would see them again."""
    impl = getattr(connection, "_impl", connection)
    impl._on_data_available = _FrameLoop(impl)


def decode_at(frame_type: int, channel: int, buffer: bytes, start: int, end: int) -> Any:
    """The frame of type ``frame_type`` on ``channel`` at ``buffer[start:end]`` (a whole
    frame, end marker included). Raises InvalidFrameError for a wrong end marker, and what
    pika's ``decode_frame`` raises for a payload it cannot read."""
    if buffer[end - 1] != spec.FRAME_END:
        raise InvalidFrameError("Invalid FRAME_END marker")
    if frame_type == spec.FRAME_BODY:
        return frame.Body(channel, buffer[start + _PAYLOAD : end - 1])
    if frame_type == spec.FRAME_METHOD and end - start >= _PAYLOAD + 5:
        if _METHOD_ID.unpack_from(buffer, start + _PAYLOAD)[0] == _DELIVER.INDEX:
            return frame.Method(channel, deliver_of(buffer[start + _PAYLOAD : end - 1]))
    elif frame_type == spec.FRAME_HEADER and end - start >= _PROPERTIES + 1:
        class_id, _, body_size = _CONTENT_HEADER.unpack_from(buffer, start + _PAYLOAD)
        if class_id == _BASIC:
            properties = spec.props[_BASIC]()
            properties.decode(buffer[start + _PROPERTIES : end - 1])
            return frame.Header(channel, body_size, properties)
    return frame.decode_frame(buffer[start:end])[1]


def deliver_of(payload: bytes) -> Any:
    """``basic.deliver`` from its method frame's payload (method id first), as
    ``spec.Basic.Deliver.decode`` reads it (pika's ``decode_short_string``: a short string
    that is not UTF-8 kept as bytes), with fewer calls. Raises struct.error for a payload
    too short, as pika does."""
    method = _DELIVER()
    method.consumer_tag, offset = decode_short_string(payload, 4)
    method.delivery_tag, bits = _TAG_AND_BITS.unpack_from(payload, offset)
    method.redelivered = bits & 1 != 0
    method.exchange, offset = decode_short_string(payload, offset + 9)
    method.routing_key, _ = decode_short_string(payload, offset)
    return method


class _FrameLoop:
    """``Connection._on_data_available`` for one connection (see the module docstring)."""

    __slots__ = ("impl",)

    def __init__(self, impl: Any) -> None:
        self.impl = impl

    def __call__(self, data_in: bytes) -> None:
        impl = self.impl
        buffer: bytes = impl._frame_buffer
        buffer = buffer + data_in if buffer else data_in
        size, offset, received, rest = len(buffer), 0, 0, False
        unpack, deliver = _FRAME_HEADER.unpack_from, impl._deliver_frame_to_channel
        try:
            while size - offset >= _PAYLOAD:
                frame_type, channel, length = unpack(buffer, offset)
                if frame_type not in _CHANNEL_FRAMES or channel == 0:
                    rest = True  # a heartbeat, channel 0, or no frame: pika's loop below
                    break
                end = offset + length + _OVERHEAD
                if end > size:
                    break  # the rest of the frame is still to come
                value = decode_at(frame_type, channel, buffer, offset, end)
                offset = end
                if frame_type == spec.FRAME_METHOD and (
                    type(value.method) is not _DELIVER or self._waited_for(channel)
                ):
                    # pika's path: hand the buffer back first (the frame may close the
                    # connection, which resets it), read it back after
                    impl._frame_buffer, buffer = buffer[offset:], b""
                    impl.bytes_received += offset
                    impl.frames_received += received
                    received, offset = 0, 0
                    impl._process_frame(value)  # counts the frame itself
                    buffer = impl._frame_buffer
                    size = len(buffer)
                    continue
                received += 1
                deliver(value)
        finally:
            if buffer or offset:
                impl._frame_buffer = buffer[offset:]
                impl.bytes_received += offset
                impl.frames_received += received
        if rest:
            type(impl)._on_data_available(impl, b"")

    def _waited_for(self, channel: int) -> bool:
        """Whether a callback is registered for ``basic.deliver`` on ``channel`` (pika's
        ``callbacks.pending(channel, method)`` without its argument sanitizing: prefixes are
        the channel number as text, keys the method's NAME)."""
        waiting = self.impl.callbacks._stack.get(str(channel))
        return bool(waiting and waiting.get(_DELIVER.NAME))
