"""Guarded observers: whatever watches the consumers and publishers (metrics) must never change
how a delivery is settled or what a publish returns, so every call into it is wrapped: an
exception is logged and swallowed (pure; imports nothing of amqp-lab, so the consuming and
publishing packages can both use it)."""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any, TypeVar

__all__ = ["guarded", "guarded_call"]

log = logging.getLogger(__name__)
ObserverT = TypeVar("ObserverT")


def guarded_call(method: Callable[..., None]) -> Callable[..., None]:
    """``method`` made harmless: an exception it raises is logged (a warning, the exception's
    type and text) and swallowed. Watching must never change how a delivery is settled or what
    a publish returns: an observer runs inside settlement and confirm paths."""

    @functools.wraps(method)
    def call(*args: Any, **kwargs: Any) -> None:
        try:
            method(*args, **kwargs)
        except Exception as e:
            log.warning(
                "observer %s raised (ignored): %s: %s", method.__name__, type(e).__name__, e
            )

    return call


class _Guarded:
    """An observer whose every public method is :func:`guarded_call`-wrapped."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self._inner, name)
        if name.startswith("_") or not callable(attribute):
            return attribute
        wrapped = guarded_call(attribute)
        setattr(self, name, wrapped)  # looked up once per method
        return wrapped


def guarded(observer: ObserverT) -> ObserverT:
    """``observer`` with every method call guarded (:func:`guarded_call`); the do-nothing
    observers are returned as they are. Used by the consumers and publishers on what they are
    given, so a buggy observer is a log line, not a lost or repeated message."""
    if type(observer).__name__ in ("NoObserver", "NoPublisherObserver"):
        return observer
    return _Guarded(observer)  # type: ignore[return-value]
