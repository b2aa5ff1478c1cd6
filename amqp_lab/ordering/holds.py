"""Per-key holds (pure): which delivery of which key may run now, and which must wait.

Every key has a line of deliveries in arrival order (the shard queue's order, which is the
publish order of that key). Only the head of a line runs; a head that failed transiently waits
until its retry is due, and the deliveries behind it wait with it - the rest of the shard's
keys keep flowing. The head leaves the line when it succeeds or is dead-lettered; the next one
then becomes the head. Times are monotonic seconds, given by the caller.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Generic, TypeVar

__all__ = ["KeyLines", "Line"]

T = TypeVar("T")


@dataclass
class Line(Generic[T]):
    """One key's deliveries in arrival order; ``failures``: the head's failures so far;
    ``due``: when the head may run again (None: now)."""

    items: deque[T] = field(default_factory=deque)
    failures: int = 0
    due: float | None = None


class KeyLines(Generic[T]):
    """The lines of every key with a delivery in hand."""

    def __init__(self) -> None:
        self._lines: dict[str, Line[T]] = {}

    def __len__(self) -> int:
        """Deliveries held, in every line."""
        return sum(len(line.items) for line in self._lines.values())

    def __contains__(self, key: str) -> bool:
        return key in self._lines

    def keys(self) -> Iterator[str]:
        return iter(self._lines)

    def arrive(self, key: str, item: T) -> bool:
        """Put ``item`` at the end of ``key``'s line; True when it is the head (runs now)."""
        line = self._lines.get(key)
        if line is None:
            self._lines[key] = Line(deque([item]))
            return True
        line.items.append(item)
        return False

    def head(self, key: str) -> T:
        """The head of ``key``'s line. KeyError when the key has no line."""
        return self._lines[key].items[0]

    def failures(self, key: str) -> int:
        return self._lines[key].failures

    def fail(self, key: str, due: float) -> int:
        """The head failed and waits until ``due``; returns its failures so far."""
        line = self._lines[key]
        line.failures += 1
        line.due = due
        return line.failures

    def done(self, key: str) -> T | None:
        """The head is settled (succeeded or dead-lettered): it leaves the line; returns the new
        head (runs now), or None when the line is empty and gone."""
        line = self._lines[key]
        line.items.popleft()
        line.failures, line.due = 0, None
        if not line.items:
            del self._lines[key]
            return None
        return line.items[0]

    def take_all(self, key: str) -> list[T]:
        """Every delivery of ``key``'s line, head first; the line is gone."""
        line = self._lines.pop(key, None)
        return list(line.items) if line is not None else []

    def due(self, now: float) -> list[str]:
        """The keys whose waiting head is due at ``now``, earliest first; they no longer wait."""
        ready = sorted(
            (line.due, key)
            for key, line in self._lines.items()
            if line.due is not None and line.due <= now
        )
        for _, key in ready:
            self._lines[key].due = None
        return [key for _, key in ready]

    def next_due(self) -> float | None:
        """The earliest time a waiting head is due (None: none waits)."""
        dues = [line.due for line in self._lines.values() if line.due is not None]
        return min(dues) if dues else None

    def clear(self) -> None:
        """Forget every line (the connection closed: the broker has them back)."""
        self._lines.clear()
