"""The cluster crash test's publisher: a thread with a pipelined confirming publisher that
publishes only as many messages as it has been allowed so far, and records each publish's
hand-over and outcome time (lab.failover.PublishRecord) for the outstanding-confirms report."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from amqp_lab.errors import AmqpLabError
from amqp_lab.message import OutgoingMessage
from amqp_lab.publishing.pipelined import PipelinedPublisher
from amqp_lab.settings import BrokerSettings
from lab.failover import PublishRecord
from lab.handler import task_message


class GatedPublisher(threading.Thread):
    """Publishes ok tasks ``{run_id}-{seq:06d}`` for seq 1..``count`` through a
    :class:`~amqp_lab.publishing.pipelined.PipelinedPublisher` (up to ``window`` unconfirmed;
    after a lost connection it republishes them on the next node of ``settings``' address list,
    same message_id). Every ``dup_every``-th message is published twice on purpose. At most
    ``rate`` messages per second (0: no cap), and never past what :meth:`allow` granted, so
    the orchestrator decides when messages are in flight.

    ``confirm_timeout``: seconds without a confirm before the publisher gives a connection up
    (the PipelinedPublisher's). ``records`` (one per publish, in hand-over order) is complete
    once the thread has ended; ``error`` holds what stopped it early (the publisher could not
    connect or failed)."""

    def __init__(
        self,
        settings: BrokerSettings,
        run_id: str,
        count: int,
        dup_every: int = 10,
        rate: float = 0.0,
        window: int = 50,
        confirm_timeout: float | None = 30.0,
    ) -> None:
        super().__init__(name="chaos-cluster-publisher", daemon=True)
        self.settings, self.run_id, self.count = settings, run_id, count
        self.confirm_timeout = confirm_timeout
        self.dup_every, self.rate, self.window = dup_every, rate, window
        self.records: list[PublishRecord] = []
        self.handed = 0  # messages handed over (a duplicate pair counts once)
        self.error: AmqpLabError | None = None
        self._sent_at: dict[int, tuple[str, float]] = {}  # publish index -> (message_id, time)
        self._done: dict[int, PublishRecord] = {}
        self._allowed = 0
        self._gate = threading.Condition()
        self._lock = threading.Lock()
        self._publisher: PipelinedPublisher | None = None

    def allow(self, messages: int) -> None:
        """Let ``messages`` more messages be published (capped at ``count``)."""
        with self._gate:
            self._allowed = min(self.count, self._allowed + messages)
            self._gate.notify_all()

    @property
    def reconnects(self) -> int:
        """Connections the publisher replaced (or failed to open) so far."""
        return 0 if self._publisher is None else self._publisher.reconnects

    @property
    def address(self) -> BrokerSettings | None:
        """The node the publisher's open connection goes to (None: between connections)."""
        return None if self._publisher is None else self._publisher.address

    def refused(self) -> dict[str, int]:
        """Publishes whose confirm did not come so far: ``nacked`` (basic.nack), ``timed_out``
        (unconfirmed when the confirm timeout gave the connection up), ``lost`` (unconfirmed
        when the connection was lost otherwise); each was retried (lab.failover's fates)."""
        pub = self._publisher
        if pub is None:
            return {"nacked": 0, "timed_out": 0, "lost": 0}
        return {"nacked": pub.nacks, "timed_out": pub.confirms_timed_out, "lost": pub.confirms_lost}

    @property
    def allowed(self) -> int:
        """Messages allowed so far (:meth:`allow`)."""
        with self._gate:
            return self._allowed

    def snapshot(self) -> list[PublishRecord]:
        """The publishes so far, as ``records`` will hold them (in hand-over order)."""
        with self._lock:
            return [
                self._done.get(i, PublishRecord(m, sent_at))
                for i, (m, sent_at) in sorted(self._sent_at.items())
            ]

    def confirmed_count(self) -> int:
        """Publishes confirmed so far."""
        with self._lock:
            return sum(1 for r in self._done.values() if r.confirmed)

    def run(self) -> None:
        try:
            with PipelinedPublisher(
                self.settings,
                window=self.window,
                max_reconnects=30,
                confirm_timeout=self.confirm_timeout,
            ) as pub:
                self._publisher = pub
                self._publish_all(pub)
                pub.flush(timeout=180)
        except AmqpLabError as e:
            self.error = e
        finally:
            self.records = self.snapshot()

    def _publish_all(self, pub: PipelinedPublisher) -> None:
        due = time.monotonic()  # the rate cap: when the next message may go
        index = 0
        for seq in range(1, self.count + 1):
            with self._gate:
                self._gate.wait_for(lambda s=seq: s <= self._allowed)  # type: ignore[misc]
            if self.rate > 0:
                time.sleep(max(0.0, due - time.monotonic()))
                due = max(due, time.monotonic() - 1 / self.rate) + 1 / self.rate
            message = task_message("ok", seq, f"{self.run_id}-{seq:06d}")
            for _ in range(2 if self.dup_every and seq % self.dup_every == 0 else 1):
                index += 1
                with self._lock:
                    self._sent_at[index] = (message.message_id, time.time())
                pub.publish_async(message, self._outcome(index, pub))
            self.handed = seq

    def _outcome(
        self, index: int, pub: PipelinedPublisher
    ) -> Callable[[OutgoingMessage, AmqpLabError | None], None]:
        """The callback (on the publisher's I/O thread) recording publish ``index``'s outcome
        and the reconnects made by then."""

        def record(message: OutgoingMessage, error: AmqpLabError | None) -> None:
            with self._lock:
                sent_at = self._sent_at[index][1]
                self._done[index] = PublishRecord(
                    message.message_id, sent_at, time.time(), error is None, pub.reconnects
                )

        return record
