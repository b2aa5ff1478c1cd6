"""Is the live vhost able to bring a retried message back? Checked, never assumed.

A consumer in ``backoff`` mode confirms each retry copy into wait queue *n*; the copy comes
back only if that queue's **effective** policy dead-letters expired messages to the retry
exchange, and that exchange routes them to the work queue. In ``reject`` mode a dead-lettered
message reaches the DLQ only through the work queue's dead-letter exchange. Only one policy
applies to a queue (the highest priority; https://www.rabbitmq.com/docs/policies), an operator
policy is merged over it, and a queue argument wins over both: any of them can silently replace
ours, and the copy is then confirmed into a queue it cannot come back from (on expiry it is
dropped). :func:`problems` (pure) reads the management API's view of the queues, names the
policy in force, and says what is wrong; :func:`check_retry_topology` fetches that view.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from amqp_lab.management import ManagementClient

__all__ = ["RetryExpectations", "check_retry_topology", "problems"]


@dataclass(frozen=True)
class RetryExpectations:
    """What the consumer relies on. ``wait_queues``: the ones its retry policy uses (empty
    outside backoff mode); ``dead_letter_exchange``: the DLX the work queue must have (reject
    mode), or None."""

    vhost: str
    queue: str
    wait_queues: tuple[str, ...]
    retry_exchange: str
    dead_letter_exchange: str | None = None


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


def problems(
    expect: RetryExpectations,
    work_queue: dict[str, Any] | None,
    wait_queues: dict[str, dict[str, Any] | None],
    retry_exchange: dict[str, Any] | None,
    retry_bindings: list[dict[str, Any]],
) -> list[str]:
    """What stops a message from coming back (empty when nothing). Inputs are the management
    API's objects: ``GET /api/queues/{vhost}/{name}`` (None: missing), the retry exchange and its
    source bindings."""
    found: list[str] = []
    if work_queue is None:
        return [f"queue {expect.queue!r} does not exist in vhost {expect.vhost!r}"]
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


def check_retry_topology(api: ManagementClient, expect: RetryExpectations) -> list[str]:
    """Fetch the queues and the retry exchange named by ``expect`` and return
    :func:`problems`. Raises ManagementError when the API cannot be asked."""
    work = api.queue(expect.vhost, expect.queue)
    waits = {name: api.queue(expect.vhost, name) for name in expect.wait_queues}
    exchange = api.exchange(expect.vhost, expect.retry_exchange) if expect.wait_queues else None
    bindings = (
        api.exchange_bindings(expect.vhost, expect.retry_exchange) if exchange is not None else []
    )
    return problems(expect, work, waits, exchange, bindings)
