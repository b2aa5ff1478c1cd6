"""The key distribution of ordered traffic (pure): how messages spread over keys and shards,
and the warnings for a hot key, a hot shard and too few keys (docs/ordering.md).

In the ordered topology every message of one key goes to one shard queue, and each shard
queue has one active consumer, so one key is processed serially by one consumer. The input
is one key per message (repetitions count) and a placement key -> shard index (1-based, as in
``q:tasks:shard:1``), or per-shard message counts when only the real queues were measured.

Default thresholds, and why:

* **hot key** (``key_threshold`` 0.10): a key above 10 % of the messages must be handled by
  one consumer alone, whatever N is, and caps the useful number of shards at 1 / 0.10 = 10:
  adding shards cannot spread it.
* **hot shard** (``shard_factor`` 1.5, i.e. 1.5 x the fair share 1/N unless an absolute
  ``shard_threshold`` is given): that shard's consumer needs 50 % more throughput than the
  others, and the backlog of every key on it grows first.
* **too few keys** (``min_keys_per_shard`` 10): with k keys hashed at random into N shards,
  each shard gets Binomial(k, 1/N) keys; at k/N = 10 the relative spread is already about
  30 %, so below that a hot shard comes from chance alone, not from one key.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from amqp_lab.errors import ConfigurationError

__all__ = [
    "DEFAULT_KEY_THRESHOLD",
    "DEFAULT_MIN_KEYS_PER_SHARD",
    "DEFAULT_SHARD_FACTOR",
    "Alert",
    "Distribution",
    "KeyShare",
    "ShardShare",
    "Thresholds",
    "analyze",
    "analyze_shard_counts",
]

DEFAULT_KEY_THRESHOLD = 0.10
DEFAULT_SHARD_FACTOR = 1.5
DEFAULT_MIN_KEYS_PER_SHARD = 10

AlertKind = Literal["hot-key", "hot-shard", "few-keys"]


@dataclass(frozen=True)
class Thresholds:
    """When to warn. ``key_threshold``: a key's share of the messages (0..1);
    ``shard_threshold``: a shard's share, or None for ``shard_factor`` x 1/N;
    ``min_keys_per_shard``: warn when distinct keys < N x this."""

    key_threshold: float = DEFAULT_KEY_THRESHOLD
    shard_threshold: float | None = None
    shard_factor: float = DEFAULT_SHARD_FACTOR
    min_keys_per_shard: int = DEFAULT_MIN_KEYS_PER_SHARD

    def __post_init__(self) -> None:
        if not 0 < self.key_threshold <= 1:
            raise ConfigurationError(f"key threshold {self.key_threshold}: expected 0 < F <= 1")
        if self.shard_threshold is not None and not 0 < self.shard_threshold <= 1:
            raise ConfigurationError(f"shard threshold {self.shard_threshold}: expected 0 < F <= 1")
        if self.shard_factor <= 0 or self.min_keys_per_shard < 0:
            raise ConfigurationError("shard factor must be > 0 and min keys per shard >= 0")

    def shard_limit(self, shards: int) -> float:
        """The share above which one of ``shards`` shards is hot."""
        if self.shard_threshold is not None:
            return self.shard_threshold
        return self.shard_factor / shards


@dataclass(frozen=True)
class KeyShare:
    """One key: its messages, their share of all messages, and its shard (None: unplaced)."""

    key: str
    count: int
    share: float
    shard: int | None = None


@dataclass(frozen=True)
class ShardShare:
    """One shard (1-based index): its messages (a float when measured as a rate), share, and
    how many distinct keys it holds (None when measured on the real queues)."""

    shard: int
    count: float
    share: float
    keys: int | None = None


@dataclass(frozen=True)
class Alert:
    """One threshold exceeded: ``subject`` names the key or shard, ``value`` / ``limit`` are
    shares (or key counts for few-keys)."""

    kind: AlertKind
    subject: str
    value: float
    limit: float
    text: str


@dataclass(frozen=True)
class Distribution:
    """The report: ``messages`` counted, ``distinct_keys`` (None when only shards were
    measured), per-shard shares (empty without placement), the top keys, the warnings."""

    messages: float
    distinct_keys: int | None
    shards: int
    shard_shares: tuple[ShardShare, ...]
    top_keys: tuple[KeyShare, ...]
    warnings: tuple[Alert, ...] = field(default=())
    unkeyed: int = 0

    @property
    def hot(self) -> bool:
        """Whether any warning fired."""
        return bool(self.warnings)

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready."""
        return {
            "messages": self.messages,
            "distinct_keys": self.distinct_keys,
            "unkeyed": self.unkeyed,
            "shards": self.shards,
            "shard_shares": [vars(s) for s in self.shard_shares],
            "top_keys": [vars(k) for k in self.top_keys],
            "warnings": [vars(w) for w in self.warnings],
        }


def _check_shards(shards: int) -> None:
    if shards < 1:
        raise ConfigurationError(f"{shards} shards: expected at least 1")


def analyze(
    keys: Iterable[str],
    placement: Mapping[str, int] | None,
    shards: int,
    *,
    top: int = 10,
    thresholds: Thresholds | None = None,
    unkeyed: int = 0,
) -> Distribution:
    """The distribution of ``keys`` (one per message). ``placement`` maps every key to its
    shard 1..``shards``; None gives no per-shard shares (and no hot-shard warning).
    ``unkeyed``: messages seen without a key, reported but not counted. Raises
    ConfigurationError for a key missing from the placement or a shard out of range."""
    _check_shards(shards)
    limits = thresholds or Thresholds()
    counts = Counter(keys)
    messages = sum(counts.values())
    per_shard: Counter[int] = Counter()
    keys_on: Counter[int] = Counter()
    if placement is not None:
        for key, n in counts.items():
            if key not in placement:
                raise ConfigurationError(f"key {key!r} has no shard in the placement")
            shard = placement[key]
            if not 1 <= shard <= shards:
                raise ConfigurationError(f"key {key!r}: shard {shard} not in 1..{shards}")
            per_shard[shard] += n
            keys_on[shard] += 1
    ranked = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    top_keys = tuple(
        KeyShare(k, n, n / messages, placement.get(k) if placement is not None else None)
        for k, n in ranked[: max(top, 0)]
    )
    shard_shares = (
        tuple(
            ShardShare(s, per_shard[s], per_shard[s] / messages if messages else 0.0, keys_on[s])
            for s in range(1, shards + 1)
        )
        if placement is not None
        else ()
    )
    warnings: list[Alert] = []
    for key, n in ranked:
        share = n / messages
        if share <= limits.key_threshold:
            break
        warnings.append(
            Alert(
                "hot-key",
                key,
                share,
                limits.key_threshold,
                f"key {key!r} carries {share:.1%} of the messages (threshold "
                f"{limits.key_threshold:.1%}): one consumer handles all of it, and more "
                f"shards cannot spread it",
            )
        )
    warnings.extend(_shard_warnings(shard_shares, shards, limits))
    wanted = shards * limits.min_keys_per_shard
    if messages and shards > 1 and len(counts) < wanted:
        warnings.append(
            Alert(
                "few-keys",
                f"{len(counts)} keys",
                len(counts),
                wanted,
                f"only {len(counts)} distinct keys for {shards} shards (fewer than "
                f"{limits.min_keys_per_shard} per shard): shard loads depend on chance",
            )
        )
    return Distribution(
        messages, len(counts), shards, shard_shares, top_keys, tuple(warnings), unkeyed
    )


def analyze_shard_counts(
    counts: Sequence[float], *, thresholds: Thresholds | None = None
) -> Distribution:
    """The distribution measured on the real shard queues: ``counts[i]`` is shard i+1's
    messages (or publish rate, messages/s). No keys, so only hot-shard warnings."""
    _check_shards(len(counts))
    if any(c < 0 for c in counts):
        raise ConfigurationError("a shard count is negative")
    limits = thresholds or Thresholds()
    total = float(sum(counts))
    shares = tuple(
        ShardShare(i, float(c), c / total if total else 0.0) for i, c in enumerate(counts, 1)
    )
    warnings = tuple(_shard_warnings(shares, len(counts), limits))
    return Distribution(total, None, len(counts), shares, (), warnings)


def _shard_warnings(shares: Sequence[ShardShare], shards: int, limits: Thresholds) -> list[Alert]:
    if shards < 2:
        return []  # one shard holds everything by design
    limit = limits.shard_limit(shards)
    return [
        Alert(
            "hot-shard",
            f"shard {s.shard}",
            s.share,
            limit,
            f"shard {s.shard} carries {s.share:.1%} of the messages (threshold {limit:.1%}, "
            f"fair share {1 / shards:.1%})",
        )
        for s in shares
        if s.share > limit
    ]
