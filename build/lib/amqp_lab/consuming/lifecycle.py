"""A consumer's life as a state machine, and how each way a consume can end is classified.

States: ``connecting`` -> ``consuming`` -> ``draining`` -> ``stopped`` (back to
``connecting`` after a recoverable end). Every end of a consume is exactly one of:

* **recoverable** - reconnect or resubscribe with backoff: a lost connection, a channel closed
  by the broker (consumer_timeout, 406 unknown delivery tag), a broker cancel (basic.cancel:
  the queue was deleted, recreated, or its node went away), a memory alarm that outlasted
  ``blocked_connection_timeout``;
* **fatal** - the worker exits non-zero with one line naming the cause: the queue missing
  (past its bound), the vhost gone or access refused, credentials revoked, a policy that makes
  retries unsafe, a dedup store down past its bound, any unexpected exception;
* **finished** - idle-exit, max-messages, or a drain asked for by :meth:`Consumer.stop`
  (SIGTERM/SIGINT): exit 0.

A consume that ends in any other way is not *finished*: nothing reports success unless it is.
The table of events, where each is detected and which test covers it is in
docs/failure-model.md. Everything here but :class:`SignalDrain` is pure.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from types import FrameType
from typing import Any, ClassVar, Protocol

from amqp_lab.errors import (
    BrokerBlocked,
    BrokerUnavailable,
    ChannelError,
    ConnectionLost,
    ConsumerCancelled,
)

__all__ = ["End", "ReconnectBudget", "SignalDrain", "State", "classify_end"]


class State(StrEnum):
    """Where a consumer is in its life."""

    CONNECTING = "connecting"
    CONSUMING = "consuming"
    DRAINING = "draining"
    STOPPED = "stopped"


class End(StrEnum):
    """How a consume ended."""

    RECOVERABLE = "recoverable"
    FATAL = "fatal"
    FINISHED = "finished"


def classify_end(error: BaseException | None) -> End:
    """The class of a consume that ended with ``error`` (None: it returned on its own, which
    only happens for idle-exit, max-messages or a requested stop).

    ConnectionLost, BrokerUnavailable, BrokerBlocked and ConsumerCancelled are recoverable, as
    is a ChannelError other than 403 ACCESS_REFUSED and 404 NOT_FOUND (a 406 from
    consumer_timeout, a 405 RESOURCE_LOCKED exclusive consumer). Everything else - the other
    BrokerConnectionErrors (authentication, vhost access), 403/404 channel errors, configuration
    and store errors, and any exception amqp-lab did not expect - is fatal."""
    if error is None:
        return End.FINISHED
    if isinstance(error, ConnectionLost | BrokerUnavailable | BrokerBlocked | ConsumerCancelled):
        return End.RECOVERABLE
    if isinstance(error, ChannelError) and error.reply_code not in (403, 404):
        return End.RECOVERABLE
    return End.FATAL


@dataclass
class ReconnectBudget:
    """Failed connections in a row, bounded by ``limit``. A connection fails unless it settled
    at least one delivery (basic.ack / nack / reject): one that opens and dies before settling
    anything counts, so connect-then-die can never loop forever (a broker that closes every new
    connection, a message that kills each connection, a handler that always outlives
    consumer_timeout)."""

    limit: int
    failures: int = 0

    def connection_ended(self, settled_any: bool) -> None:
        """Record the end of one connection (or of an attempt to open one)."""
        self.failures = 0 if settled_any else self.failures + 1

    @property
    def exhausted(self) -> bool:
        return self.failures >= self.limit


class Stoppable(Protocol):
    def stop(self, reason: str = ...) -> None: ...


class SignalDrain:
    """Install SIGTERM/SIGINT handlers for the duration of a ``with`` block (main thread only).

    The first signal asks ``consumer`` to drain: stop consuming (basic.cancel), let the
    handlers in flight finish, commit, ack what was committed, and return. ``exit_code`` is then
    0 after SIGTERM (systemd, Docker and Kubernetes send it on every deploy) and 130 after
    SIGINT. A second signal exits the process at once (``os._exit(128 + signum)``): only then,
    or on SIGKILL, can a committed batch stay unacked - the broker redelivers it and the dedup
    store skips it."""

    EXIT_CODES: ClassVar[dict[signal.Signals, int]] = {signal.SIGTERM: 0, signal.SIGINT: 130}

    def __init__(
        self,
        consumer: Stoppable,
        signals: tuple[signal.Signals, ...] = (signal.SIGTERM, signal.SIGINT),
        exit_now: Callable[[int], Any] = os._exit,
        on_signal: Callable[[str], None] | None = None,
    ) -> None:
        self.consumer = consumer
        self.signals = signals
        self.received: signal.Signals | None = None
        self._exit_now = exit_now
        self._on_signal = on_signal
        self._previous: dict[signal.Signals, Any] = {}

    @property
    def exit_code(self) -> int | None:
        """0 (SIGTERM), 130 (SIGINT), None when no signal came."""
        return None if self.received is None else self.EXIT_CODES.get(self.received, 1)

    def _handle(self, signum: int, _frame: FrameType | None) -> None:
        sig = signal.Signals(signum)
        if self.received is not None:
            self._exit_now(128 + signum)
            return
        self.received = sig
        if self._on_signal is not None:
            self._on_signal(f"{sig.name}: draining (a second signal exits at once)")
        self.consumer.stop(f"{sig.name} received")

    def __enter__(self) -> SignalDrain:
        for sig in self.signals:
            self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, previous in self._previous.items():
            signal.signal(sig, previous)
