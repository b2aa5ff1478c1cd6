"""amqp_lab.cli.progress.Progress: a self-rewriting line on a terminal, nothing in a pipe."""

from __future__ import annotations

import io

import pytest

from amqp_lab.cli.progress import Progress

pytestmark = pytest.mark.unit


class FakeTty(io.StringIO):
    def isatty(self) -> bool:
        return True


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_silent_when_the_stream_is_not_a_tty() -> None:
    stream = io.StringIO()
    with Progress("replay", total=10, stream=stream) as progress:
        for i in range(10):
            progress.update(i + 1, "note")
        progress.clear()
    assert not progress.enabled
    assert progress.count == 10  # counted all the same
    assert stream.getvalue() == ""


def test_draws_on_a_tty_rewriting_its_line() -> None:
    stream, clock = FakeTty(), Clock()
    progress = Progress("replay", total=200, unit="records", stream=stream, clock=clock)
    assert progress.enabled
    progress.update(50, "m-0042")
    clock.now += 1
    progress.update(100)
    first, second = "replay: 50/200 records (25%) m-0042", "replay: 100/200 records (50%)"
    # the shorter line blanks what is left of the longer one
    assert stream.getvalue() == f"\r{first}\r{second}" + " " * (len(first) - len(second))


def test_without_a_total_it_shows_the_count() -> None:
    assert Progress("listing", stream=io.StringIO()).line() == "listing: 0"
    progress = Progress("listing", unit="records", stream=io.StringIO())
    progress.step(3)
    progress.step()
    assert progress.line("x") == "listing: 4 records x"


def test_throttles_by_the_injected_clock() -> None:
    stream, clock = FakeTty(), Clock()
    progress = Progress("chaos", stream=stream, clock=clock, interval=0.5)
    progress.update(1)
    clock.now += 0.2
    progress.update(2)  # too soon: not drawn
    clock.now += 0.2
    progress.update(3)  # 0.4 s after the last draw: still not
    clock.now += 0.1
    progress.update(4)  # 0.5 s: drawn
    assert stream.getvalue().split("\r")[1:] == ["chaos: 1", "chaos: 4"]
    assert progress.count == 4


def test_close_draws_the_final_count_and_ends_the_line() -> None:
    stream, clock = FakeTty(), Clock()
    with Progress("bench", total=4, stream=stream, clock=clock) as progress:
        progress.update(1)
        progress.update(4)  # throttled, but close shows it
    assert stream.getvalue() == "\rbench: 1/4 (25%)\rbench: 4/4 (100%)\n"
    progress.update(5)  # after close: nothing more
    progress.close()
    assert stream.getvalue().endswith("(100%)\n")


def test_close_of_a_progress_that_never_counted_writes_nothing() -> None:
    stream = FakeTty()
    Progress("idle", stream=stream).close()
    assert stream.getvalue() == ""


def test_clear_erases_the_line_and_the_next_update_redraws_at_once() -> None:
    stream, clock = FakeTty(), Clock()
    progress = Progress("chaos", stream=stream, clock=clock, interval=10)
    progress.update(12)
    progress.clear()
    assert stream.getvalue() == "\rchaos: 12" + "\r" + " " * 9 + "\r"
    progress.update(13)  # within the interval, but the line was erased: drawn again
    assert stream.getvalue().endswith("\rchaos: 13")
    Progress("quiet", stream=FakeTty()).clear()  # nothing drawn: nothing to erase


def test_enabled_overrides_the_tty_check() -> None:
    assert not Progress("x", stream=FakeTty(), enabled=False).enabled
    stream = io.StringIO()
    progress = Progress("x", stream=stream, enabled=True)
    progress.update(1)
    assert stream.getvalue() == "\rx: 1"
