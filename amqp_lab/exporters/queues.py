"""The queue-side exporter: what a worker cannot report about itself.

A worker's own metrics stop when it dies and cannot say that nobody consumes; the DLQ's depth
and age are not a worker's business either. :class:`QueueCollector` is a prometheus-client
custom collector that asks the broker on every scrape, over one short AMQP connection:

* ``queue.declare(passive=True)`` of the work queue, the DLQ, the shard queues of the ordered
  variant and the wait queues that exist: ready messages and consumers, exact (no statistics
  lag, no management plugin needed);
* the DLQ's head: ``basic.get`` of ONE message without ack, its ``last_failed_at`` read with
  :func:`amqp_lab.dlq.view.view_of` (whatever a publisher put there: a time that does not
  read as ISO 8601 is no time, and a time without a zone is UTC), then
  ``basic.nack(requeue=True)``, which puts it back at its position
  (https://www.rabbitmq.com/docs/confirms#consumer-nacks-requeue); a
  synchronous call on the same channel follows, so the message is back before the connection
  closes. The head is the oldest record. Nothing is consumed; the head's redelivered flag is
  set, and on a quorum DLQ before 4.3 the return counts in ``x-delivery-count`` (the quorum
  topology gives the DLQ no delivery limit, docs/topology.md).

A scrape never raises: an unreachable broker, a refused login or a missing work queue or DLQ
sets ``amqp_lab_queue_probe_success`` to 0 and logs one line (passwords masked). A wait queue
the broker does not have is skipped: the topology may have fewer in use.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pika.exceptions as pe
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from amqp_lab.connection import close_quietly, connect, translate
from amqp_lab.dlq.summary import time_of
from amqp_lab.dlq.view import view_of
from amqp_lab.errors import AmqpLabError, NotFound
from amqp_lab.settings import BrokerSettings
from amqp_lab.topology.model import Names

__all__ = [
    "DEFAULT_TIMEOUT",
    "QueueCollector",
    "QueueProbe",
    "QueueState",
    "metric_families",
    "probe_queues",
]

log = logging.getLogger(__name__)

DEFAULT_TIMEOUT = 8.0
"""Seconds a scrape waits for the broker: below Prometheus' default scrape timeout (10 s)."""


@dataclass(frozen=True)
class QueueState:
    """One queue as ``queue.declare(passive=True)`` saw it: ready ``messages``, ``consumers``."""

    queue: str
    messages: int
    consumers: int


@dataclass
class QueueProbe:
    """What one scrape found. ``ok``: the broker answered and every required queue exists;
    ``dlq_oldest_age``: seconds since the DLQ head's ``last_failed_at`` (0.0 when the DLQ is
    empty, None when unknown: no head time, or the DLQ was not reached)."""

    vhost: str
    dlq: str
    ok: bool = True
    queues: list[QueueState] = field(default_factory=list)
    dlq_oldest_age: float | None = None


def metric_families(probe: QueueProbe) -> list[GaugeMetricFamily]:
    """The exporter's gauges for ``probe`` (pure): messages and consumers per queue, the DLQ's
    oldest record age in seconds (absent when unknown), probe success 1 or 0."""
    messages = GaugeMetricFamily(
        "amqp_lab_queue_messages",
        "Ready messages in the queue (queue.declare passive, at scrape time)",
        labels=["vhost", "queue"],
    )
    consumers = GaugeMetricFamily(
        "amqp_lab_queue_consumers",
        "Consumers subscribed to the queue (queue.declare passive, at scrape time)",
        labels=["vhost", "queue"],
    )
    age = GaugeMetricFamily(
        "amqp_lab_dlq_oldest_record_age_seconds",
        "Seconds since the DLQ head record's last_failed_at; 0 when the DLQ is empty",
        labels=["vhost", "queue"],
    )
    success = GaugeMetricFamily(
        "amqp_lab_queue_probe_success",
        "1 when the broker and every required queue answered the last scrape, else 0",
        labels=["vhost"],
    )
    for state in probe.queues:
        messages.add_metric([probe.vhost, state.queue], state.messages)
        consumers.add_metric([probe.vhost, state.queue], state.consumers)
    if probe.dlq_oldest_age is not None:
        age.add_metric([probe.vhost, probe.dlq], probe.dlq_oldest_age)
    success.add_metric([probe.vhost], 1.0 if probe.ok else 0.0)
    return [messages, consumers, age, success]


def _declare(connection: Any, channel: Any, queue: str) -> tuple[Any, QueueState | None]:
    """Passively declare ``queue``: (the channel to use next, its state or None when missing).
    A 404 closes the channel, so a new one is opened for what follows."""
    try:
        method = channel.queue_declare(queue, passive=True).method
    except pe.ChannelClosedByBroker as e:
        if not isinstance(translate(e), NotFound):
            raise
        return connection.channel(), None
    return channel, QueueState(queue, int(method.message_count), int(method.consumer_count))


def _head_age(channel: Any, dlq: str, now: float) -> float | None:
    """Age in seconds of the DLQ head record: basic.get one message without ack, read it,
    basic.nack it back with requeue, then a synchronous call so it is back. 0.0 when empty;
    None when the head carries no readable time."""
    method, properties, body = channel.basic_get(dlq, auto_ack=False)
    if method is None:
        return 0.0
    try:  # view_of reads whatever a publisher put there; an unreadable time is no time
        failed_at = time_of(view_of(body, properties).last_failed_at)
    finally:
        channel.basic_nack(method.delivery_tag, multiple=False, requeue=True)
        channel.queue_declare(dlq, passive=True)
    if failed_at is None:
        return None
    return max(0.0, now - failed_at.timestamp())


def probe_queues(
    settings: BrokerSettings, names: Names, clock: Callable[[], float] = time.time
) -> QueueProbe:
    """Probe the broker once (see the module docstring); ``clock``: seconds since the epoch.
    Never raises for a broker problem: it is logged and the probe says ``ok=False``."""
    probe = QueueProbe(settings.vhost, names.dlq)
    required = [names.queue, *names.shard_queues, names.dlq]
    optional = [names.wait_queue(n) for n in range(1, names.wait_queues + 1)]
    connection = None
    try:
        connection = connect(settings)
        channel = connection.channel()
        for queue in [*required, *optional]:
            channel, state = _declare(connection, channel, queue)
            if state is not None:
                probe.queues.append(state)
            elif queue in required:
                probe.ok = False
                log.warning(
                    "queue %r not found in vhost %r at %s: probe failed for it (apply the "
                    "topology, or check --topology)",
                    queue,
                    settings.vhost,
                    settings.masked_url,
                )
        if any(state.queue == names.dlq for state in probe.queues):
            probe.dlq_oldest_age = _head_age(channel, names.dlq, clock())
    except Exception as e:  # a scrape must never raise
        error = e if isinstance(e, AmqpLabError) else translate(e, settings)
        probe.ok = False
        log.warning("queue probe of vhost %r failed: %s", settings.vhost, error)
    finally:
        close_quietly(connection)
    return probe


class QueueCollector(Collector):
    """``QueueCollector(settings, names, timeout=8.0)``: on each scrape (:meth:`collect`),
    :func:`probe_queues` over a short AMQP connection, waited for at most ``timeout`` seconds
    (past it the scrape reports probe failure; the probe ends in the background, within
    pika's socket and handshake timeouts, and its held DLQ head returns with its connection).
    Register it on a ``CollectorRegistry``; ``clock``: seconds since the epoch."""

    def __init__(
        self,
        settings: BrokerSettings,
        names: Names,
        *,
        timeout: float = DEFAULT_TIMEOUT,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.settings = settings
        self.names = names
        self.timeout = timeout
        self.clock = clock

    def describe(self) -> Iterable[GaugeMetricFamily]:
        """The metric names, without samples: registering the collector contacts nobody."""
        return metric_families(QueueProbe(self.settings.vhost, self.names.dlq))

    def collect(self) -> Iterator[GaugeMetricFamily]:
        """Probe the broker now and yield the gauges. Never raises."""
        probe = self._probe_with_deadline()
        yield from metric_families(probe)

    def _probe_with_deadline(self) -> QueueProbe:
        found: list[QueueProbe] = []

        def target() -> None:
            found.append(probe_queues(self.settings, self.names, self.clock))

        thread = threading.Thread(target=target, name="amqp-lab-queue-probe", daemon=True)
        thread.start()
        thread.join(self.timeout)
        if found:
            return found[0]
        log.warning(
            "queue probe of vhost %r took more than %.1f s: reported as failed",
            self.settings.vhost,
            self.timeout,
        )
        return QueueProbe(self.settings.vhost, self.names.dlq, ok=False)
