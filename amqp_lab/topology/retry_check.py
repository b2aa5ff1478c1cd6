"""Can the live vhost bring a retried message back, and keep every record the DLQ confirmed?
Checked, never assumed.

A consumer in ``backoff`` mode confirms each retry copy into wait queue *n*; the copy comes
back only if that queue's **effective** policy dead-letters expired messages to the retry
exchange, and that exchange routes them to the work queue. In ``reject`` mode a dead-lettered
message reaches the DLQ only through the work queue's dead-letter exchange. Only one policy
applies to a queue (the highest priority; https://www.rabbitmq.com/docs/policies), an operator
policy is merged over it, and a queue argument wins over both: any of them can silently replace
ours, and the copy is then confirmed into a queue it cannot come back from (on expiry it is
dropped). :func:`problems` (pure) reads the management API's view of the queues, names the
policy in force, and says what is wrong; :func:`check_retry_topology` fetches that view.

The DLQ is checked the same way (:func:`dlq_problems`): a record is confirmed and its original
acked, so any setting that can later drop a record loses the message. Refused: a length or
byte limit without ``overflow: reject-publish`` (the default ``drop-head`` drops the oldest
records; with reject-publish a full DLQ refuses the record, which the consumer then does not
ack), a message TTL, a queue TTL (``expires``), a finite quorum ``delivery-limit`` (listing
the DLQ is basic.get + basic.nack requeue, which quorum queues count up to 4.2, and a tool
killed while it holds records is a lost consumer on every version: past the limit a DLQ
without a DLX drops the record;
https://www.rabbitmq.com/docs/quorum-queues#poison-message-handling), a stream (its
retention drops whole segments), a queue that is not durable or is auto-delete.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from amqp_lab.errors import ManagementError, QueueViewIncomplete
from amqp_lab.management import ManagementClient

__all__ = [
    "RetryExpectations",
    "check_retry_topology",
    "definite",
    "dlq_problems",
    "incomplete_views",
    "problems",
    "unknown_error",
]


@dataclass(frozen=True)
class RetryExpectations:
    """What the consumer relies on. ``wait_queues``: the ones its retry policy uses (empty
    outside backoff mode); ``dead_letter_exchange``: the DLX the work queue must have (reject
    mode), or None; ``dlq``: the DLQ whose settings must keep every record (None: not
    checked)."""

    vhost: str
    queue: str
    wait_queues: tuple[str, ...]
    retry_exchange: str
    dead_letter_exchange: str | None = None
    dlq: str | None = None


def _setting(queue: dict[str, Any], key: str) -> Any:
    """A queue's effective setting: the ``x-<key>`` argument wins over the effective policy."""
    arguments = queue.get("arguments") or {}
    if f"x-{key}" in arguments:
        return arguments[f"x-{key}"]
    return (queue.get("effective_policy_definition") or {}).get(key)


def _in_force(queue: dict[str, Any]) -> str:
    policy = queue.get("policy") or None
    operator = queue.get("operator_policy") or None
    text = f"policy {policy!r}" if policy else "no policy"
    return text + (f" with operator policy {operator!r}" if operator else "")


def _expires(what: str, queue: dict[str, Any], consequence: str) -> list[str]:
    """The problem a queue TTL (``expires``) makes, if it has one."""
    expires = _setting(queue, "expires")
    if expires is None:
        return []
    return [f"{what} expires after {expires} ms unused ({_in_force(queue)}): {consequence}"]


def topic_matches(pattern: str, routing_key: str) -> bool:
    """AMQP topic matching: words split on dots, ``*`` is one word, ``#`` zero or more."""
    words, keys = pattern.split("."), routing_key.split(".")
    # reachable[j]: the pattern read so far can match the first j words of the key
    reachable = [True] + [False] * len(keys)
    for word in words:
        if word == "#":
            for j in range(1, len(keys) + 1):
                reachable[j] = reachable[j] or reachable[j - 1]
        else:
            reachable = [False] + [
                reachable[j] and (word == "*" or word == keys[j]) for j in range(len(keys))
            ]
    return reachable[-1]


def _routes(exchange: dict[str, Any], bindings: list[dict[str, Any]], key: str, queue: str) -> bool:
    kind = exchange.get("type")
    for binding in bindings:
        if binding.get("destination") != queue or binding.get("destination_type") != "queue":
            continue
        bound = str(binding.get("routing_key", ""))
        if kind in ("fanout", "headers") or (kind == "direct" and bound == key):
            return True
        if kind == "topic" and topic_matches(bound, key):
            return True
    return False


_KEEPING_OVERFLOWS = ("reject-publish", "reject-publish-dlx")


def dlq_problems(
    name: str, queue: dict[str, Any] | None, version: tuple[int, int] | None = None
) -> list[str]:
    """What can drop a record the DLQ ``name`` confirmed (empty when nothing; see the module
    docstring). ``queue``: ``GET /api/queues/{vhost}/{name}`` (None: missing); ``version``:
    the broker's (major, minor), which says whether a quorum queue without a delivery-limit
    has the default of 20 (4.0 and later; None: taken as 4.0 or later)."""
    if queue is None:
        return [f"DLQ {name!r} does not exist: every DLQ record would be unroutable"]
    what, where = f"DLQ {name!r}", _in_force(queue)
    found: list[str] = []
    kind = queue.get("type") or (queue.get("arguments") or {}).get("x-queue-type")
    if kind == "stream":
        found.append(f"{what} is a stream: its retention drops whole segments of records")
    if queue.get("durable") is False:
        found.append(f"{what} is not durable: a broker restart loses every record")
    if queue.get("auto_delete"):
        found.append(f"{what} is auto-delete: it goes, with its records, with its last consumer")
    overflow = _setting(queue, "overflow") or "drop-head"
    for key in ("max-length", "max-length-bytes"):
        limit = _setting(queue, key)
        if limit is not None and overflow not in _KEEPING_OVERFLOWS:
            found.append(
                f"{what} drops its oldest records past {key} {limit} (overflow {overflow}; "
                f"{where}): set overflow reject-publish, so a full DLQ refuses a record instead"
            )
    ttl = _setting(queue, "message-ttl")
    if ttl is not None:
        found.append(f"{what} drops records after message-ttl {ttl} ms ({where})")
    found += _expires(what, queue, "it would be deleted with its records")
    if kind == "quorum":
        found += _delivery_limit(what, queue, version)
    return found


def _delivery_limit(what: str, queue: dict[str, Any], version: tuple[int, int] | None) -> list[str]:
    """A quorum DLQ's finite delivery-limit, if it has one. RabbitMQ 4.3's API reports the
    limit in force (``delivery_limit``: a number or ``unlimited``); before, the settings say
    it: the lower of the argument and the policy, -1 for none, and when neither is set the
    default of 20 from 4.0 on (none before)."""
    reported = queue.get("delivery_limit")
    if reported == "unlimited":
        return []
    if isinstance(reported, int) and not isinstance(reported, bool) and reported >= 0:
        limit = reported
    else:
        settings = [
            value
            for value in (
                (queue.get("arguments") or {}).get("x-delivery-limit"),
                (queue.get("effective_policy_definition") or {}).get("delivery-limit"),
            )
            if isinstance(value, int) and not isinstance(value, bool)
        ]
        finite = [value for value in settings if value >= 0]
        if finite:
            limit = min(finite)
        elif settings or (version is not None and version < (4, 0)):
            return []  # -1: no limit; before 4.0 no default limit
        else:
            limit = 20
    return [
        f"{what} is a quorum queue with delivery-limit {limit} ({_in_force(queue)}): listing "
        "it counts toward the limit (up to 4.2), as does a tool killed while holding records, "
        "and past it a record is dropped; set delivery-limit -1 (the quorum topology does)"
    ]


def problems(
    expect: RetryExpectations,
    work_queue: dict[str, Any] | None,
    wait_queues: dict[str, dict[str, Any] | None],
    retry_exchange: dict[str, Any] | None,
    retry_bindings: list[dict[str, Any]],
    dlq: dict[str, Any] | None = None,
    version: tuple[int, int] | None = None,
) -> list[str]:
    """What stops a message from coming back, or a record from staying (empty when nothing).
    Inputs are the management API's objects: ``GET /api/queues/{vhost}/{name}`` (None:
    missing), the retry exchange and its source bindings, the DLQ (checked when
    ``expect.dlq`` is set) and the broker's (major, minor) version."""
    found: list[str] = []
    if work_queue is None:
        return [f"queue {expect.queue!r} does not exist in vhost {expect.vhost!r}"]
    if expect.dlq is not None:
        found += dlq_problems(expect.dlq, dlq, version)
    if expect.dead_letter_exchange is not None:
        dlx = _setting(work_queue, "dead-letter-exchange")
        if dlx != expect.dead_letter_exchange:
            found.append(
                f"queue {expect.queue!r} dead-letters to {dlx!r}, expected "
                f"{expect.dead_letter_exchange!r} ({_in_force(work_queue)}): a rejected message "
                "would not reach the DLQ"
            )
    found += _expires(
        f"queue {expect.queue!r}", work_queue, "it would be deleted with its messages"
    )
    if not expect.wait_queues:
        return found
    if retry_exchange is None:
        found.append(f"retry exchange {expect.retry_exchange!r} does not exist")
    for name in expect.wait_queues:
        queue = wait_queues.get(name)
        if queue is None:
            found.append(f"wait queue {name!r} does not exist")
            continue
        where = _in_force(queue)
        dlx = _setting(queue, "dead-letter-exchange")
        if dlx != expect.retry_exchange:
            found.append(
                f"wait queue {name!r} dead-letters to {dlx!r}, not to the retry exchange "
                f"{expect.retry_exchange!r} ({where}; a higher-priority or operator policy may "
                "have replaced ours): an expired retry would be lost"
            )
        elif retry_exchange is not None:
            key = _setting(queue, "dead-letter-routing-key") or name
            if not _routes(retry_exchange, retry_bindings, str(key), expect.queue):
                found.append(
                    f"retry exchange {expect.retry_exchange!r} does not route routing key "
                    f"{key!r} (from wait queue {name!r}) to queue {expect.queue!r}"
                )
        found += _expires(
            f"wait queue {name!r}",
            queue,
            "it has no consumer, so it would be deleted with the retries in it",
        )
    return found


def incomplete_views(views: dict[str, dict[str, Any] | None]) -> list[str]:
    """The queues (by name) whose view lacks ``effective_policy_definition``, a key the
    management API reports ({} when no policy applies) once it has the queue's statistics:
    not for a quorum queue between leaders (``state`` down, ``policy`` absent), nor for a
    queue declared less than a statistics interval ago (seen on 3.10), nor at all when
    statistics are disabled. Their settings are unknown: judging them would find a DLQ
    "without a policy" that has one. Missing queues (None) are not incomplete: they are
    missing."""
    return [
        name
        for name, view in views.items()
        if view is not None and "effective_policy_definition" not in view
    ]


def definite(found: list[str], unknown: list[str]) -> list[str]:
    """The problems of ``found`` that name none of the ``unknown`` queues (those were judged
    on views without settings): what is wrong whatever their settings turn out to be."""
    return [p for p in found if not any(repr(name) in p for name in unknown)]


def unknown_error(
    views: dict[str, dict[str, Any] | None], unknown: list[str], overview: dict[str, Any]
) -> ManagementError:
    """The error for queues whose settings the API did not report: QueueViewIncomplete (to
    ask again), or, when the broker's statistics are disabled (``disable_stats`` in ``GET
    /api/overview``: ``management_agent.disable_metrics_collector`` or
    ``management.disable_stats``), a ManagementError no wait can clear."""
    states = ", ".join(
        f"{n!r} ({(views[n] or {}).get('type', '?')}, {(views[n] or {}).get('state', '?')})"
        for n in unknown
    )
    if overview.get("disable_stats") is True:
        return ManagementError(
            f"the management API reports {states} without its settings: the broker's "
            "statistics are disabled (management_agent.disable_metrics_collector or "
            "management.disable_stats), so no policy in force can be read"
        )
    return QueueViewIncomplete(
        f"the management API reports {states} without its settings: a queue whose leader or "
        "node it cannot reach (a quorum election under way), or whose statistics it has not "
        "collected yet (declared less than a statistics interval ago)"
    )


def check_retry_topology(api: ManagementClient, expect: RetryExpectations) -> list[str]:
    """Fetch the queues and the retry exchange named by ``expect`` (and the DLQ and the
    broker's version when ``expect.dlq`` is set) and return :func:`problems`. When the API
    reports a queue without its settings (:func:`incomplete_views`), the problems that stand
    whatever those settings are (:func:`definite`) are returned; without any, it raises
    :func:`unknown_error`'s error. Raises ManagementError when the API cannot be asked."""
    work = api.queue(expect.vhost, expect.queue)
    waits = {name: api.queue(expect.vhost, name) for name in expect.wait_queues}
    dlq = api.queue(expect.vhost, expect.dlq) if expect.dlq is not None else None
    exchange = api.exchange(expect.vhost, expect.retry_exchange) if expect.wait_queues else None
    bindings = (
        api.exchange_bindings(expect.vhost, expect.retry_exchange) if exchange is not None else []
    )
    views = {expect.queue: work, **waits, **({expect.dlq: dlq} if expect.dlq else {})}
    unknown = incomplete_views(views)
    overview = api.overview() if expect.dlq is not None or unknown else {}
    version = _version(overview) if expect.dlq is not None else None
    found = problems(expect, work, waits, exchange, bindings, dlq, version)
    if not unknown:
        return found
    standing = definite(found, unknown)
    if standing:
        return standing
    raise unknown_error(views, unknown, overview)


def _version(overview: dict[str, Any]) -> tuple[int, int] | None:
    """(major, minor) of ``rabbitmq_version`` in ``GET /api/overview``; None if unreadable."""
    parts = str(overview.get("rabbitmq_version", "")).split(".")
    try:
        return int(parts[0]), int(parts[1])
    except (IndexError, ValueError):
        return None
