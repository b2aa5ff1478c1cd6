"""The garbage collector's settings for a long-running worker or relay process.

A consumer keeps each batch of deliveries alive for the few milliseconds its unit runs
(``ack_batch`` of them: the Delivery, its Task, the headers and JSON body dicts, pika's frames).
With CPython's default young-generation threshold (700 container allocations) those objects
outlive several young collections, get promoted, and die in the older generations, whose
collections then walk every object the process holds: the ~50,000 that the imports alone leave
(pika, psycopg, prometheus-client, OpenTelemetry). Measured on the bench's 20,000-delivery
consume (docs/benchmarks.md, 2026-12-04): about 240 young, 21 middle and 1-2 full collections,
100-130 ms of a 1.3 s run.

:func:`tune_gc` moves what is alive once start-up is done into the permanent generation
(:func:`gc.freeze`, which CPython documents for forking servers; here for its other effect: no
collection walks a frozen object again), and raises the young threshold, so that a batch is
mostly freed by reference counting before a young collection looks at it. Start-up's own
garbage is collected first, so nothing dead is frozen. Cycles are still collected, only less
often: at most ``young_threshold`` container objects wait for the next young collection.

This is process-wide state: the library's consumers never call it themselves. The worker and
relay commands do (``--gc-young-threshold``, 0 to leave CPython's settings alone), and
``benchmarks/bench.py`` measures every path with what the worker uses.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

__all__ = [
    "DEFAULT_YOUNG_THRESHOLD",
    "MAX_YOUNG_THRESHOLD",
    "GcSettings",
    "restore_gc",
    "tune_gc",
    "tuned_gc",
]

MAX_YOUNG_THRESHOLD = 2**31 - 1
"""The largest threshold :func:`gc.set_threshold` takes (a C int)."""
DEFAULT_YOUNG_THRESHOLD = 10_000
"""Container allocations (less deallocations) between young collections for a worker:
14 times CPython's 700, so a batch of 500 deliveries fits in it several times over. Measured
(docs/benchmarks.md, 2026-12-04): the consumer alone in one process, alternating with 700,
about 10% more deliveries per second; in the whole bench the runs' noise hides most of it."""


@dataclass(frozen=True, slots=True)
class GcSettings:
    """What :func:`tune_gc` replaced, for :func:`restore_gc`: the thresholds
    (:func:`gc.get_threshold`) and whether it froze the objects then alive (not when
    something had frozen objects before it: :func:`gc.unfreeze` would release those too)."""

    thresholds: tuple[int, int, int]
    froze: bool


def tune_gc(young_threshold: int = DEFAULT_YOUNG_THRESHOLD, freeze: bool = True) -> GcSettings:
    """Collect start-up's garbage and freeze what is alive now (:func:`gc.freeze`; call it
    once start-up is done) - unless something froze objects already - and set the young
    generation's threshold to ``young_threshold`` (the older generations' stay as they are).
    ``young_threshold`` 0 changes nothing. Returns the previous settings. Raises ValueError
    for a threshold outside 0..MAX_YOUNG_THRESHOLD, before changing anything."""
    if not 0 <= young_threshold <= MAX_YOUNG_THRESHOLD:
        raise ValueError(
            f"the young generation's threshold must be within 0..{MAX_YOUNG_THRESHOLD}, "
            f"got {young_threshold}"
        )
    previous = gc.get_threshold()
    if young_threshold == 0:
        return GcSettings(previous, froze=False)
    gc.set_threshold(young_threshold, previous[1], previous[2])
    froze = freeze and gc.get_freeze_count() == 0
    if froze:
        gc.collect()
        gc.freeze()
    return GcSettings(previous, froze=froze)


def restore_gc(settings: GcSettings) -> None:
    """Undo :func:`tune_gc`: the previous thresholds, and the frozen objects back in the oldest
    generation (:func:`gc.unfreeze`) when it froze them - with whatever else was frozen since
    (Python keeps one permanent generation, not one per caller)."""
    gc.set_threshold(*settings.thresholds)
    if settings.froze:
        gc.unfreeze()


@contextmanager
def tuned_gc(young_threshold: int = DEFAULT_YOUNG_THRESHOLD) -> Iterator[GcSettings]:
    """:func:`tune_gc` for the ``with`` block, :func:`restore_gc` after it (a command's
    ``main`` may run more than once in one process: the tests)."""
    settings = tune_gc(young_threshold)
    try:
        yield settings
    finally:
        restore_gc(settings)
