"""Which shard each key lands on: learned from the broker by a probe, or an offline stand-in.

**How RabbitMQ places a key** (rabbitmq_consistent_hash_exchange, ``route/2`` and
``add_binding`` in ``rabbit_exchange_type_consistent_hash.erl``, 3.8 to 4.x): the exchange
hashes the routing key with ``erlang:phash2`` and picks bucket
``jump_consistent_hash(hash, B)`` where B is the total of the binding weights; buckets are
numbered in the order the bindings were added (the first binding of weight W owns buckets
0..W-1, the next W..2W-1, and so on) and each bucket maps to its binding's queue. The queue
*name* is not hashed, so a probe with other, server-named queues bound with the **same weights
in the same order** gets the same placement as the real shard queues: the probe is exact, not
an estimate, under that condition. It is not exact when the real exchange's bindings were
added in another order (shard 2 before shard 1, a shard unbound and bound again: removing a
binding shifts the later buckets down, re-adding it appends it at the end) or with other
weights. One more case: on releases that keep the ring in Mnesia, a restart rebuilds the ring
of a durable exchange from its bindings sorted by destination name; for shard names
``q:tasks:shard:1``..``9`` that is the index order, from 10 shards on it is not
(``...:10`` sorts before ``...:2``). ``rabbitmq-diagnostics consistent_hash_exchange_ring_state
tasks.ordered`` shows the real ring; ``scripts/keys.py report --live`` measures the real
queues instead, without any placement.

**The probe** (:func:`probe_placement`): on one connection, with publisher confirms, it
declares a non-durable auto-delete ``x-consistent-hash`` exchange and N exclusive server-named
queues bound to it with the weight as binding key, publishes one empty message per distinct key
(routing key = the key, the key also in the ``key`` header), basic.gets every queue (auto-ack)
to read which queue each key reached, and deletes the exchange; the exclusive queues go with
the connection. Keys go in batches, so the probe queues never hold more than one batch.

**Offline** (:func:`offline_placement`): ``crc32(key) mod N + 1``, a documented stand-in for
when no broker is reachable. It shows how a key set spreads under *a* uniform hash, but it is
not RabbitMQ's placement: a given key can land on another shard in the real topology.
"""

from __future__ import annotations

import uuid
import zlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import pika

from amqp_lab.connection import close_quietly, connect, translate
from amqp_lab.errors import AmqpLabError, TopologyError
from amqp_lab.ordering.key_sources import KEY_HEADER, check_key
from amqp_lab.settings import BrokerSettings

__all__ = [
    "DEFAULT_SHARDS",
    "DEFAULT_WEIGHT",
    "EXCHANGE_TYPE",
    "PLUGIN_MISSING",
    "Placement",
    "offline_placement",
    "probe_placement",
]

EXCHANGE_TYPE = "x-consistent-hash"
DEFAULT_SHARDS = 4
DEFAULT_WEIGHT = 20
BATCH = 500
PLUGIN_MISSING = (
    "the consistent-hash exchange plugin is not enabled: "
    "rabbitmq-plugins enable rabbitmq_consistent_hash_exchange"
)


@dataclass(frozen=True)
class Placement:
    """Key -> shard index (1..``shards``). ``method`` is "probe" (the broker's own routing)
    or "offline" (the crc32 stand-in); ``note`` says what that means for the report."""

    shards: int
    shard_of: Mapping[str, int]
    method: str
    note: str


def offline_placement(keys: Iterable[str], shards: int = DEFAULT_SHARDS) -> Placement:
    """``crc32(UTF-8 key) mod shards + 1`` for each distinct key (pure). Not RabbitMQ's."""
    shard_of = {
        key: zlib.crc32(key.encode("utf-8", "surrogatepass")) % shards + 1 for key in set(keys)
    }
    return Placement(
        shards, shard_of, "offline", "offline stand-in: crc32(key) mod N, not RabbitMQ's placement"
    )


def _plugin_missing(error: BaseException) -> bool:
    """Whether the broker refused exchange.declare for its type: RabbitMQ 4.3 closes the
    channel with 406 PRECONDITION_FAILED "unknown exchange type 'x-consistent-hash'" (measured,
    tests/integration/test_keys_report.py); older releases may answer 503 COMMAND_INVALID
    with the same text, closing the connection."""
    code = getattr(error, "reply_code", None)
    text = str(getattr(error, "reply_text", "")).lower()
    return code in (406, 503) and "unknown exchange type" in text


def probe_placement(
    settings: BrokerSettings,
    keys: Iterable[str],
    shards: int = DEFAULT_SHARDS,
    weight: int = DEFAULT_WEIGHT,
    batch: int = BATCH,
) -> Placement:
    """The broker's placement of each distinct key over ``shards`` queues bound with binding
    key ``weight`` (see the module docstring for when it equals the real topology's).
    Raises TopologyError(:data:`PLUGIN_MISSING`) when the broker does not know the exchange
    type, ConfigurationError for a key over 255 bytes, and the translated connection errors."""
    if shards < 1 or weight < 1 or batch < 1:
        raise TopologyError("the probe needs shards >= 1, weight >= 1, batch >= 1")
    distinct = sorted(set(keys))
    for key in distinct:
        check_key(key, f"key {key[:40]!r}")
    exchange = f"keys.probe.{uuid.uuid4().hex[:12]}"
    shard_of: dict[str, int] = {}
    connection = connect(settings)
    try:
        channel = connection.channel()
        channel.confirm_delivery()
        channel.exchange_declare(exchange, EXCHANGE_TYPE, durable=False, auto_delete=True)
        queues: list[str] = []
        for _ in range(shards):
            queue = channel.queue_declare("", exclusive=True, auto_delete=True).method.queue
            channel.queue_bind(queue, exchange, routing_key=str(weight))
            queues.append(queue)
        for start in range(0, len(distinct), batch):
            chunk = distinct[start : start + batch]
            for key in chunk:
                channel.basic_publish(
                    exchange,
                    key,
                    b"",
                    pika.BasicProperties(headers={KEY_HEADER: key}),
                    mandatory=True,
                )
            for index, queue in enumerate(queues, 1):
                while True:
                    method, _, _ = channel.basic_get(queue, auto_ack=True)
                    if method is None:
                        break
                    shard_of[_text(method.routing_key)] = index
            missing = [key for key in chunk if key not in shard_of]
            if missing:
                raise TopologyError(
                    f"probe: {len(missing)} key(s) reached no probe queue, e.g. {missing[0]!r}"
                )
        channel.exchange_delete(exchange)
    except AmqpLabError:
        raise
    except Exception as e:
        if _plugin_missing(e):
            raise TopologyError(PLUGIN_MISSING) from e
        raise translate(e, settings) from e
    finally:
        close_quietly(connection)
    return Placement(
        shards,
        shard_of,
        "probe",
        f"probe: the broker's own placement over {shards} queues of weight {weight} bound "
        "in shard order (equal to the real shards' when they were bound the same way)",
    )


def _text(value: str | bytes) -> str:
    return value.decode("utf-8", "surrogateescape") if isinstance(value, bytes) else value
