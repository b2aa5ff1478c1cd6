"""The handler contract: what a handler may be (check_handler) and what each result means
(call_handler): every return value and every raise has one defined outcome."""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import threading
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from amqp_lab.consuming.handler_contract import call_handler, check_handler, handler_name
from amqp_lab.errors import ConfigurationError, HandlerContractError, TransientError

pytestmark = pytest.mark.unit


def sync_handler(task: Any, db: Any) -> None:
    db.append(("sync", task))


async def async_handler(task: Any, db: Any) -> None:
    await asyncio.sleep(0)
    db.append(("async", task))


def generator_handler(task: Any, db: Any) -> Iterator[int]:
    db.append("ran")
    yield 1


async def async_generator_handler(task: Any, db: Any) -> AsyncIterator[int]:
    yield 1


class Callable:
    def __call__(self, task: Any, db: Any) -> None:
        db.append(("call", task))


class AsyncCallable:
    async def __call__(self, task: Any, db: Any) -> None:
        db.append(("acall", task))


class GeneratorCallable:
    def __call__(self, task: Any, db: Any) -> Iterator[int]:
        yield 1


# --- check_handler ----------------------------------------------------------------------------
@pytest.mark.parametrize(
    "handler",
    [
        sync_handler,
        async_handler,
        Callable(),
        AsyncCallable(),
        functools.partial(lambda extra, task, db: None, 1),
        lambda task, db=None, *rest: None,
        lambda *args: None,
        print,  # a builtin: no signature to check
    ],
    ids=[
        "function",
        "async",
        "callable",
        "async-callable",
        "partial",
        "defaults",
        "star",
        "builtin",
    ],
)
def test_check_handler_accepts_what_can_run_to_the_end(handler: Any) -> None:
    assert check_handler(handler) is handler


@pytest.mark.parametrize(
    ("handler", "says"),
    [
        (42, "is not callable (a int)"),
        (Callable, "is a class"),
        (generator_handler, "is a generator function"),
        (async_generator_handler, "is an async generator function"),
        (GeneratorCallable(), "is a generator function"),
        (lambda task: None, "cannot be called as handler(task, db)"),
        (lambda task, db, more: None, "cannot be called as handler(task, db)"),
        (lambda task, db, *, key: None, "cannot be called as handler(task, db)"),
    ],
    ids=["int", "class", "generator", "async-generator", "generator-call", "one", "three", "kw"],
)
def test_check_handler_refuses_in_one_line_naming_the_handler(handler: Any, says: str) -> None:
    with pytest.raises(ConfigurationError) as caught:
        check_handler(handler, "myapp.handlers:handle")
    text = str(caught.value)
    assert "handler myapp.handlers:handle" in text and says in text
    assert "\n" not in text


def test_handler_name_names_module_and_function() -> None:
    assert handler_name(sync_handler) == f"{__name__}:sync_handler"
    assert handler_name(functools.partial(sync_handler, 1)) == f"{__name__}:sync_handler"
    assert handler_name(Callable()) == f"{__name__}:Callable"


# --- call_handler -----------------------------------------------------------------------------
def test_a_sync_handler_runs_once() -> None:
    db: list[Any] = []
    call_handler(sync_handler, "t", db)
    assert db == [("sync", "t")]


@pytest.mark.parametrize("handler", [async_handler, AsyncCallable()], ids=["def", "call"])
def test_an_async_handler_is_awaited_with_the_same_db(handler: Any) -> None:
    db: list[Any] = []
    call_handler(handler, "t", db)
    assert db and db[0][1] == "t" and len(db) == 1


def test_a_sync_handler_returning_a_coroutine_is_awaited() -> None:
    db: list[Any] = []
    call_handler(lambda task, db: async_handler(task, db), "t", db)
    assert db == [("async", "t")]


def test_an_awaitable_returning_an_awaitable_is_awaited_to_the_end() -> None:
    db: list[Any] = []

    async def outer(task: Any, db: Any) -> Any:
        return async_handler(task, db)

    call_handler(outer, "t", db)
    assert db == [("async", "t")]


def test_an_async_handlers_exception_is_its_failure() -> None:
    async def fails(task: Any, db: Any) -> None:
        await asyncio.sleep(0)
        raise TransientError("503")

    with pytest.raises(TransientError, match="503"):
        call_handler(fails, "t", [])


def test_cancelled_error_from_an_async_handler_is_raised_as_its_failure() -> None:
    async def cancelled(task: Any, db: Any) -> None:
        raise asyncio.CancelledError

    with pytest.raises(asyncio.CancelledError):
        call_handler(cancelled, "t", [])


def test_a_returned_generator_is_a_contract_error_and_is_closed() -> None:
    closed: list[bool] = []

    def body() -> Iterator[int]:
        try:
            yield 1
        finally:
            closed.append(True)

    generator = body()
    next(generator)  # started, so closing runs its finally
    with pytest.raises(HandlerContractError, match="returned a generator: its body never ran"):
        call_handler(lambda task, db: generator, "t", [])
    assert closed == [True]


def test_a_returned_async_generator_is_a_contract_error() -> None:
    with pytest.raises(HandlerContractError, match="returned an async generator"):
        call_handler(lambda task, db: async_generator_handler(task, db), "t", [])


def test_a_returned_future_is_a_contract_error() -> None:
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        future = pool.submit(lambda: None)
        with pytest.raises(HandlerContractError, match=r"concurrent.futures.Future"):
            call_handler(lambda task, db: future, "t", [])


def test_a_future_of_another_loop_is_a_contract_error() -> None:
    other = asyncio.new_event_loop()
    try:
        future = other.create_future()
        with pytest.raises(HandlerContractError, match="another event loop"):
            call_handler(lambda task, db: future, "t", [])
    finally:
        other.close()


def test_tasks_left_running_are_cancelled_and_fail_the_delivery() -> None:
    late: list[str] = []
    cancelled: list[bool] = []

    async def background() -> None:
        try:
            await asyncio.sleep(30)
            late.append("wrote after the commit")
        except asyncio.CancelledError:
            cancelled.append(True)
            raise

    async def leaves_a_task(task: Any, db: Any) -> None:
        asyncio.get_running_loop().create_task(background())
        await asyncio.sleep(0)

    with pytest.raises(HandlerContractError, match="left 1 task"):
        call_handler(leaves_a_task, "t", [])
    assert (late, cancelled) == ([], [True])
    call_handler(async_handler, "next", [])  # the thread's loop is clean for the next one


def test_async_handlers_on_several_threads_each_get_their_own_loop() -> None:
    seen: list[int] = []
    lock = threading.Lock()

    async def records_loop(task: Any, db: Any) -> None:
        await asyncio.sleep(0.01)
        with lock:
            seen.append(id(asyncio.get_running_loop()))

    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        list(pool.map(lambda n: call_handler(records_loop, n, []), range(16)))
    assert len(seen) == 16 and 1 < len(set(seen)) <= 4


@given(
    st.one_of(
        st.none(),
        st.booleans(),
        st.integers(),
        st.floats(allow_nan=True),
        st.text(),
        st.binary(),
        st.lists(st.integers()),
        st.dictionaries(st.text(), st.integers()),
    )
)
def test_any_plain_value_returned_means_the_code_ran_to_the_end(value: object) -> None:
    call_handler(lambda task, db: value, "t", [])  # no exception: success
