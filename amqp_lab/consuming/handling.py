"""The handler side of the consumer: what runs on a handler thread for one unit of
deliveries - the redelivery count (poison detection), the dedup claim and the handler in one
store transaction (one per delivery, or one per batch), and ``first_seen`` for failures - all
committed before the consumer's I/O thread settles anything (pure of pika: no channel here).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

from opentelemetry import trace

from amqp_lab.consuming.config import ConsumerConfig, Handler
from amqp_lab.consuming.delivery import Delivery
from amqp_lab.consuming.handler_contract import call_handler
from amqp_lab.consuming.handler_watch import HandlerWatch
from amqp_lab.consuming.observer import NO_OBSERVER, ConsumerObserver
from amqp_lab.consuming.settlement import Action, attempt_number, classify, decide
from amqp_lab.consuming.store_retry import StoreRetry
from amqp_lab.dedup import DedupStore
from amqp_lab.errors import DedupStoreError, PoisonMessage, TransactionTimedOut
from amqp_lab.message import FIRST_SEEN_HEADER, Task

__all__ = ["HandlerRunner"]

log = logging.getLogger(__name__)

T = TypeVar("T")


class HandlerRunner:
    """Runs units of deliveries on handler threads (thread-safe: the stores keep a connection
    per thread). ``store_retry`` retries the store's outages (StoreUnavailable) with backoff;
    ``watch`` is told when each handler call starts and ends (``handler_warn_after``);
    ``observer`` how long each store operation took, the handler's own time excluded. A
    delivery with an OpenTelemetry span (``Delivery.span``) runs its handler with that span
    current, so the handler's spans are its children.

    ``count_failures`` (default: the config's retry mode is ``requeue``): before a failed
    delivery is requeued, its failure count is committed in the store, and a redelivered
    delivery is numbered from it (:func:`~amqp_lab.consuming.settlement.attempt_number`):
    what went back without running never uses up a retry. Off for the ordered consumer, whose
    retries are counted in the worker."""

    def __init__(
        self,
        handler: Handler,
        store: DedupStore,
        config: ConsumerConfig,
        store_retry: StoreRetry,
        watch: HandlerWatch | None = None,
        observer: ConsumerObserver = NO_OBSERVER,
        count_failures: bool | None = None,
    ) -> None:
        self.handler = handler
        self.count_failures = (
            config.retry.mode == "requeue" if count_failures is None else count_failures
        )
        self.store = store
        self.config = config
        self._store = store_retry
        self.watch = watch or HandlerWatch(None, config.queue)
        self.observer = observer
        self._handler_time = threading.local()  # handler seconds inside the store call

    def _call(self, operation: str, call: Callable[[], T]) -> T:
        """``call`` (one store operation, retried through an outage by StoreRetry), each try
        timed for the observer without the handler seconds spent inside it."""

        def timed() -> T:
            self._handler_time.seconds = 0.0
            started = time.perf_counter()
            try:
                result = call()
            except BaseException:
                self._observe(operation, started)
                raise
            self._observe(operation, started)
            return result

        return self._store.call(timed)

    def _observe(self, operation: str, started: float) -> None:
        """Tell the observer one store operation's seconds, without the handler's; never
        raises (a failing observer must not change the store's result)."""
        try:
            spent = time.perf_counter() - started - self._handler_time.seconds
            self.observer.store_call(operation, max(0.0, spent))
        except Exception as e:
            log.warning("observer store_call raised (ignored): %s: %s", type(e).__name__, e)

    def process(self, batch: list[Delivery]) -> None:
        """Handler thread: every store call and handler run of a batch, committed before any
        ack. A redelivered delivery runs alone, after its redelivery is counted and committed:
        a handler that kills the process is counted against its own message only."""
        try:
            self._process(batch)
        finally:
            self.watch.forget([id(d) for d in batch])

    def run_again(self, d: Delivery) -> None:
        """Handler thread: run a delivery whose handler already ran on this connection and
        failed (the ordered consumer's in-worker retry): claim + handler in one transaction,
        with no redelivery counted - it is the same delivery, not a broker redelivery."""
        try:
            if d.task is not None:
                self._run([d])
        finally:
            self.watch.forget([id(d)])

    def _process(self, batch: list[Delivery]) -> None:
        limit = self.config.max_redeliveries
        fresh: list[Delivery] = []
        for d in batch:
            if d.task is None:
                continue
            if not d.redelivered:
                fresh.append(d)
                continue
            message_id = d.task.message_id
            returned = self._call(
                "note_return", functools.partial(self.store.note_return, message_id, d.now)
            )
            if returned.processed:
                d.duplicate = True  # committed already, its ack was lost: not a crash
                continue
            if self.count_failures:
                d.attempt = attempt_number(d.header_attempts, returned.failures)
                d.task = dataclasses.replace(d.task, attempt=d.attempt)
            if returned.redeliveries > limit:
                d.error = PoisonMessage(
                    f"delivered {returned.redeliveries + 1} times without being settled "
                    f"(max_redeliveries {limit}): its handler may be killing the worker; not "
                    "run again"
                )
            else:
                self._run([d])
        if fresh:
            self._run(fresh)
        for d in batch:
            if d.error is not None and d.store_key is not None:
                self._note_failure(d, d.store_key)

    def _note_failure(self, d: Delivery, message_id: str) -> None:
        """Commit what the store keeps of a failure before it is settled: ``first_seen`` and,
        with ``count_failures``, the failure count the requeued delivery will be numbered by
        (forgotten when this failure ends the message's life)."""
        if self.count_failures:
            settlement = decide(classify(d.error), d.attempt, self.config.retry)
            failures = (
                d.attempt - d.header_attempts if settlement.action is Action.REQUEUE else None
            )
            note = functools.partial(self.store.note_failure, message_id, d.now, failures)
            d.first_seen_at = self._call("note_failure", note)
        elif not isinstance(d.headers.get(FIRST_SEEN_HEADER), str):
            first_seen = functools.partial(self.store.first_seen, message_id, d.now)
            d.first_seen_at = self._call("first_seen", first_seen)

    def _run(self, work: list[Delivery]) -> None:
        """Claim + handler for each delivery, in one transaction when batching; a batch whose
        transaction the database ended for a time limit of its own (TransactionTimedOut) runs
        again one delivery at a time."""
        batched = self.config.ack_batch > 1 and len(work) > 1
        process_batch = getattr(self.store, "process_batch", None)
        if batched and process_batch is not None:
            pairs = [
                (d.task.message_id, HandlerCall(self, d, d.task))
                for d in work
                if d.task is not None
            ]
            try:
                results: list[bool | BaseException] = self._call(
                    "process_batch", functools.partial(process_batch, pairs)
                )
            except TransactionTimedOut as e:
                # the server ended the batch's transaction (nothing committed): each delivery
                # runs again alone, so the time limit fails only the handler that overran it
                log.warning("%s; the batch's %d deliveries run again one by one", e, len(work))
            else:
                for d, result in zip(work, results, strict=True):
                    d.duplicate = result is False
                    d.error = result if isinstance(result, BaseException) else None
                return
        for d in work:
            assert d.task is not None and d.message_id is not None
            work_fn = self._work(d, d.task)
            try:
                once = functools.partial(self.store.process_once, d.message_id, work_fn)
                d.duplicate = not self._call("process_once", once)
            except DedupStoreError:
                raise  # the store failed, not the handler: stop, nothing is acked
            except BaseException as e:  # the handler's error decides the settlement; even a
                d.error = e  # sys.exit() in a handler is its failure, never the worker's success

    def _work(self, d: Delivery, task: Task) -> Callable[[Any], None]:
        """``work(db)`` for the store: the handler under its contract, timed and watched."""
        return HandlerCall(self, d, task)

    def add_handler_time(self, spent: float) -> None:
        """Handler thread: ``spent`` seconds of handler time inside the current store call
        (left out of the store's time for the observer)."""
        self._handler_time.seconds = getattr(self._handler_time, "seconds", 0.0) + spent


class HandlerCall:
    """``call(db)``: the handler on one delivery's task under its contract
    (:func:`~amqp_lab.consuming.handler_contract.call_handler`), with the watch told when it
    starts and ends, its time added to the delivery's ``handler_seconds``, and the delivery's
    span current while it runs. One small object per delivery, not closures: a batch of fast
    handlers leaves little for the garbage collector to trace."""

    __slots__ = ("d", "runner", "task")

    def __init__(self, runner: HandlerRunner, d: Delivery, task: Task) -> None:
        self.runner = runner
        self.d = d
        self.task = task

    def __call__(self, db: Any) -> None:
        runner, d = self.runner, self.d
        key = id(d)
        runner.watch.started(key, d.message_id or "?")
        started = time.perf_counter()
        try:
            if d.span is None or d.span is trace.INVALID_SPAN:
                call_handler(runner.handler, self.task, db)  # no trace context to make current
            else:
                with trace.use_span(
                    d.span,
                    end_on_exit=False,
                    record_exception=False,  # recorded, masked, when the span ends
                    set_status_on_exception=False,
                ):
                    call_handler(runner.handler, self.task, db)
        finally:
            spent = time.perf_counter() - started
            d.handler_seconds = (d.handler_seconds or 0.0) + spent
            runner.add_handler_time(spent)
            runner.watch.finished(key)
