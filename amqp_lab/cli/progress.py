"""Progress for long commands: a line that rewrites itself on a terminal, nothing in a pipe.

Replay, listing a large DLQ, chaos, bench and the loss lab can run for minutes. On a terminal
they show how far they are (``\\r``-rewritten on stderr, at most every ``interval`` seconds);
when stderr is a pipe or a file - CI, ``| jq``, a log - they print nothing, so what the
command prints on stdout stays exactly what a program parses.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import TextIO

__all__ = ["Progress"]


class Progress:
    """``Progress("replay", total=None)``: call :meth:`update` with the count so far (or
    :meth:`step`), :meth:`close` at the end (or use it as a context manager). ``stream``:
    where it writes (stderr); ``enabled``: None follows ``stream.isatty()``; ``interval``:
    seconds between two redraws; ``clock``: monotonic seconds."""

    def __init__(
        self,
        label: str,
        total: int | None = None,
        *,
        unit: str = "",
        stream: TextIO | None = None,
        enabled: bool | None = None,
        interval: float = 0.2,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.label = label
        self.total = total
        self.unit = unit
        self.stream = stream if stream is not None else sys.stderr
        if enabled is None:
            isatty = getattr(self.stream, "isatty", None)
            enabled = bool(isatty()) if isatty is not None else False
        self.enabled = enabled
        self.interval = interval
        self.clock = clock
        self.count = 0
        self._drawn_at: float | None = None
        self._width = 0

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def step(self, n: int = 1) -> None:
        """``n`` more done."""
        self.update(self.count + n)

    def update(self, count: int, note: str = "") -> None:
        """``count`` done so far (``note``: a few words after the count); redraws at most
        every ``interval`` seconds, and only when enabled."""
        self.count = count
        if not self.enabled:
            return
        now = self.clock()
        if self._drawn_at is not None and now - self._drawn_at < self.interval:
            return
        self._drawn_at = now
        self._draw(note)

    def line(self, note: str = "") -> str:
        """The text shown: ``label: 120/500 unit (24%) note``."""
        unit = f" {self.unit}" if self.unit else ""
        if self.total:
            pct = 100 * self.count / self.total
            text = f"{self.label}: {self.count}/{self.total}{unit} ({pct:.0f}%)"
        else:
            text = f"{self.label}: {self.count}{unit}"
        return f"{text} {note}".rstrip()

    def _draw(self, note: str) -> None:
        text = self.line(note)
        pad = max(0, self._width - len(text))
        self._width = len(text)
        self.stream.write("\r" + text + " " * pad)
        self.stream.flush()

    def clear(self) -> None:
        """Erase the drawn line, so that another line (a log line on stdout, on the same
        terminal) starts at column 0; the next :meth:`update` redraws it at once. Nothing when
        disabled or nothing is drawn."""
        if not self.enabled or self._drawn_at is None:
            return
        self.stream.write("\r" + " " * self._width + "\r")
        self.stream.flush()
        self._drawn_at = None
        self._width = 0

    def close(self) -> None:
        """Draw the final count and end the line (nothing when disabled)."""
        if not self.enabled or (self._drawn_at is None and self.count == 0):
            return
        self._draw("")
        self.stream.write("\n")
        self.stream.flush()
        self.enabled = False
