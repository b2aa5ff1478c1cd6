"""The handler contract (pure of pika): what a handler may be, and what each thing it returns
means.

A handler is called as ``handler(task, db)`` inside the dedup transaction. "processed" means
its code ran to the end, so :func:`call_handler` gives every result one meaning:

=====================================  =============================================
the handler returned                   outcome
=====================================  =============================================
None, or any other plain value         its code ran to the end: success (the value
                                       is ignored)
a coroutine or another awaitable       awaited on the handler thread's own event loop,
(``async def`` handlers)               with the same ``task`` and ``db`` in the same
                                       transaction; then judged by these rows again
a generator or async generator         HandlerContractError: its body never ran
a ``concurrent.futures.Future``        HandlerContractError: the work runs elsewhere
an asyncio future of another loop      HandlerContractError: it cannot be awaited here
=====================================  =============================================

An async handler that leaves tasks running on its loop when it returns fails the same way:
those tasks are cancelled, because their writes would land outside the transaction and after
the ack. Whatever the handler raises - any ``BaseException``, ``asyncio.CancelledError`` and
``SystemExit`` included - is its failure and is classified by
:func:`amqp_lab.consuming.settlement.classify`. HandlerContractError is a BusinessError: a
handler that breaks the contract breaks it on every try, so the delivery goes to the DLQ at
once, with the reason in its record.

:func:`check_handler` refuses, when the consumer is made (or ``--handler`` is loaded), what
can never honour the contract: something not callable, a class, a generator function, an async
generator function, or a signature that cannot take ``(task, db)``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
import threading
import types
from typing import Any

from amqp_lab.errors import ConfigurationError, HandlerContractError

__all__ = ["call_handler", "check_handler", "handler_name"]

_MAX_AWAITS = 8  # an awaitable that returns an awaitable that returns...: a bound, not a loop
_local = threading.local()


def handler_name(handler: object) -> str:
    """``module:qualname`` of a handler, for messages (a partial is named by its function, an
    object with ``__call__`` by its class)."""
    target = getattr(handler, "func", handler) if _is_partial(handler) else handler
    qualname = getattr(target, "__qualname__", None)
    module = getattr(target, "__module__", None)
    if not isinstance(qualname, str):
        qualname = type(target).__qualname__
        module = type(target).__module__
    return f"{module}:{qualname}" if isinstance(module, str) else qualname


def check_handler(handler: object, name: str | None = None) -> Any:
    """Return ``handler`` when it can honour the contract; raise ConfigurationError naming it
    (``name``, else :func:`handler_name`) when it cannot: not callable, a class (calling it
    makes an object, it runs nothing to the end), a generator or async generator function (its
    body never runs when called), or a signature that cannot be called with two positional
    arguments ``(task, db)``. Coroutine functions (``async def``) and objects with an async
    ``__call__`` are accepted: :func:`call_handler` awaits them."""
    label = name or handler_name(handler)
    if not callable(handler):
        raise ConfigurationError(
            f"handler {label} is not callable (a {type(handler).__name__}): give a function "
            "handler(task, db)"
        )
    if inspect.isclass(handler):
        raise ConfigurationError(
            f"handler {label} is a class: give a function or an object's method, handler(task, db)"
        )
    call = handler if inspect.isroutine(handler) or _is_partial(handler) else type(handler).__call__
    if inspect.isgeneratorfunction(call) or inspect.isasyncgenfunction(call):
        kind = "an async generator" if inspect.isasyncgenfunction(call) else "a generator"
        raise ConfigurationError(
            f"handler {label} is {kind} function: calling it would not run its body (remove "
            "the yield, or write async def without yield)"
        )
    try:
        signature = inspect.signature(handler)
    except (TypeError, ValueError):
        return handler  # a builtin without a signature: nothing more to check
    try:
        signature.bind(None, None)
    except TypeError as e:
        raise ConfigurationError(
            f"handler {label}{signature} cannot be called as handler(task, db): {e}"
        ) from e
    return handler


def _is_partial(handler: object) -> bool:
    return type(handler).__name__ == "partial" and hasattr(handler, "func")


def call_handler(handler: Any, task: Any, db: Any) -> None:
    """Call ``handler(task, db)`` and honour what it returned (the module's table): return
    when its code ran to the end; raise what it raised; raise HandlerContractError when the
    result cannot be honoured. Awaitables run on this thread's event loop (one per handler
    thread, made on first use), so async handlers keep the thread's ``db`` and transaction."""
    result = handler(task, db)
    for _ in range(_MAX_AWAITS):
        if result is None:
            return
        if inspect.isawaitable(result):
            result = _await(result, handler)
            continue
        _refuse_deferred(result, handler)
        return  # a plain value: the code ran to the end; the value has no meaning
    raise HandlerContractError(
        f"handler {handler_name(handler)} returned awaitables {_MAX_AWAITS} levels deep"
    )


def _refuse_deferred(result: object, handler: Any) -> None:
    """Raise HandlerContractError for a result whose work has not run (or runs elsewhere)."""
    if isinstance(result, types.GeneratorType | types.AsyncGeneratorType):
        what = "a generator" if isinstance(result, types.GeneratorType) else "an async generator"
        _close_quietly(result)
        raise HandlerContractError(
            f"handler {handler_name(handler)} returned {what}: its body never ran (remove the "
            "yield)"
        )
    if isinstance(result, concurrent.futures.Future):
        raise HandlerContractError(
            f"handler {handler_name(handler)} returned a concurrent.futures.Future: its work "
            "runs outside the transaction; wait for it (future.result()) inside the handler"
        )


def _close_quietly(generator: Any) -> None:
    """Close a generator the handler returned (its ``finally`` blocks run, nothing else)."""
    try:
        if isinstance(generator, types.GeneratorType):
            generator.close()
        else:
            _loop().run_until_complete(generator.aclose())
    except Exception:  # a generator that raises on close: the contract error says enough
        return


def _loop() -> asyncio.AbstractEventLoop:
    """This handler thread's event loop (made, and set as the thread's, on first use)."""
    loop: asyncio.AbstractEventLoop | None = getattr(_local, "loop", None)
    if loop is None or loop.is_closed():
        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        _local.loop = loop
    return loop


def _await(awaitable: Any, handler: Any) -> Any:
    """Run ``awaitable`` to its end on this thread's loop and return its value. Tasks it left
    running are cancelled and make it a HandlerContractError (their work would run after the
    commit, outside the transaction)."""
    loop = _loop()
    if asyncio.isfuture(awaitable) and awaitable.get_loop() is not loop:
        raise HandlerContractError(
            f"handler {handler_name(handler)} returned a future of another event loop: it "
            "cannot be awaited on the handler thread"
        )

    async def run() -> Any:
        return await awaitable

    try:
        value = loop.run_until_complete(run())
    finally:
        left = [task for task in asyncio.all_tasks(loop) if not task.done()]
        for task in left:
            task.cancel()
        if left:
            loop.run_until_complete(asyncio.gather(*left, return_exceptions=True))
    if left:
        raise HandlerContractError(
            f"handler {handler_name(handler)} left {len(left)} task(s) running on its event "
            "loop when it returned (cancelled): await them inside the handler, their writes "
            "must be in its transaction"
        )
    return value
