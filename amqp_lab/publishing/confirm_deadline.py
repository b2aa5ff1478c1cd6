"""A limit on how long one blocking publish waits for its publisher confirm.

pika's ``BlockingChannel.basic_publish`` on a confirm-mode channel waits for basic.ack or
basic.nack with no limit of its own. Heartbeats end a stalled link (after about two missed
intervals), and ``blocked_connection_timeout`` a blocked connection. A node on the minority
side of a network partition keeps both alive and confirms nothing until the partition heals
(:mod:`amqp_lab.publishing.confirm_watch`), so such a publish could wait for hours.

:func:`confirm_deadline` puts a timer on the connection's I/O loop. pika runs those timers
inside basic_publish's own wait. The timer looks every ``ConfirmWatch.interval`` seconds, and
once the confirm is overdue it ends the TCP stream. A frozen node would never answer a
connection.close, so the stream is ended without one. This uses pika 1.3-1.4 internals:
``_adapter_call_later``, ``_adapter_remove_timeout`` and ``_terminate_stream`` (the last as
the pipelined publisher and :func:`amqp_lab.connection.drop_connection` use it).

basic_publish then raises pika's ``StreamLostError`` ("no publisher confirm within N s"),
which the caller translates to ConnectionLost. The outcome is unknown: the message may be
stored. Publishing it again on a new connection, with the same message_id, may duplicate it,
and the consumer's dedup absorbs that.

Where pika lacks those internals, there is no limit: the wait is what it was before.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pika.exceptions as pe

from amqp_lab.publishing.confirm_watch import ConfirmWatch

__all__ = ["DEFAULT_CONFIRM_TIMEOUT", "confirm_deadline"]

log = logging.getLogger(__name__)

DEFAULT_CONFIRM_TIMEOUT = 30.0
"""Seconds: the PipelinedPublisher's default, and the blocking publishers'."""


def _never_blocked() -> bool:
    return False


@contextmanager
def confirm_deadline(
    connection: Any,
    timeout: float | None,
    blocked: Callable[[], bool] = _never_blocked,
    clock: Callable[[], float] | None = None,
) -> Iterator[None]:
    """While the block runs, drop ``connection`` (a pika BlockingConnection) once a publish
    has waited ``timeout`` seconds for its confirm. ``timeout`` None means no limit.

    The clock starts again at every look that finds the connection ``blocked()``
    (connection.blocked: ``blocked_connection_timeout`` is the limit there), so it counts
    only time spent unblocked. ``clock`` gives monotonic seconds (the ConfirmWatch default
    when None).

    Raises ValueError for a timeout <= 0. The publish inside raises pika's StreamLostError
    when the deadline ends the connection."""
    watch = ConfirmWatch(timeout) if clock is None else ConfirmWatch(timeout, clock)
    impl: Any = getattr(connection, "_impl", None)
    call_later = getattr(impl, "_adapter_call_later", None)
    remove = getattr(impl, "_adapter_remove_timeout", None)
    terminate = getattr(impl, "_terminate_stream", None)
    interval = watch.interval
    if interval is None or call_later is None or remove is None or terminate is None:
        yield  # no limit: what pika alone does
        return
    sent_at = watch.clock()
    timer: object | None = None

    def look() -> None:
        nonlocal timer
        timer = None
        if not impl.is_open:
            # ended in the same pass of the I/O loop (an EOF, a connection.close): pika has
            # torn the stream down and raises that; terminating again would fail on it
            return
        held = blocked()
        if held:
            watch.progress()  # the broker holds the publish back: its own limit applies
        if not watch.overdue(sent_at, held):
            timer = call_later(interval, look)
            return
        text = f"no publisher confirm within {watch.timeout} s"
        log.warning("publisher: %s; dropping the connection", text)
        terminate(pe.StreamLostError(text))

    timer = call_later(interval, look)
    try:
        yield
    finally:
        if timer is not None:
            remove(timer)
