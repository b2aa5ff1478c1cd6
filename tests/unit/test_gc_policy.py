"""The garbage collector's settings for a long-running command (amqp_lab.gc_policy): what is
alive at start-up frozen, the young threshold raised, both undone afterwards; and the worker's
``--gc-young-threshold``."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

from amqp_lab.cli import relay
from amqp_lab.cli.worker_options import worker_parser
from amqp_lab.gc_policy import (
    DEFAULT_YOUNG_THRESHOLD,
    MAX_YOUNG_THRESHOLD,
    restore_gc,
    tune_gc,
    tuned_gc,
)

pytestmark = [pytest.mark.unit, pytest.mark.timeout(30)]


@pytest.fixture(autouse=True)
def _collector_as_found() -> Iterator[None]:
    """Whatever a test does, the collector is left as CPython's defaults had it."""
    thresholds = gc.get_threshold()
    yield
    gc.set_threshold(*thresholds)
    gc.unfreeze()


class _Cycle:
    """A container in a reference cycle: only the collector frees it."""

    def __init__(self) -> None:
        self.me = self


def test_tune_gc_freezes_what_is_alive_and_raises_the_young_threshold() -> None:
    before = gc.get_threshold()
    settings = tune_gc(25_000)
    assert gc.get_threshold() == (25_000, before[1], before[2])
    assert gc.get_freeze_count() > 1000  # the imports' objects, out of every collection
    assert settings.thresholds == before and settings.froze
    restore_gc(settings)
    assert gc.get_threshold() == before
    assert gc.get_freeze_count() == 0


def test_zero_changes_nothing() -> None:
    before = gc.get_threshold()
    settings = tune_gc(0)
    assert gc.get_threshold() == before and gc.get_freeze_count() == 0
    assert not settings.froze


@pytest.mark.parametrize("threshold", [-1, MAX_YOUNG_THRESHOLD + 1])
def test_a_threshold_gc_cannot_take_is_refused_before_anything_changes(threshold: int) -> None:
    before = gc.get_threshold()
    with pytest.raises(ValueError, match=f"within 0..{MAX_YOUNG_THRESHOLD}, got {threshold}"):
        tune_gc(threshold)
    assert gc.get_threshold() == before and gc.get_freeze_count() == 0


def test_start_ups_garbage_is_collected_not_frozen() -> None:
    cycle = _Cycle()
    dead = weakref.ref(cycle)
    del cycle
    settings = tune_gc(20_000)
    assert dead() is None  # collected before the freeze: a frozen cycle would live for good
    restore_gc(settings)


def test_objects_someone_else_froze_stay_frozen(monkeypatch: pytest.MonkeyPatch) -> None:
    """tune_gc freezes only when nothing is frozen: restore_gc's unfreeze would otherwise
    release what the application froze itself. (The frozen count itself can drop between two
    reads - a frozen object another thread frees is gone - so CI once saw 180,311 against
    180,313: what is asserted is that nothing was unfrozen.)"""
    gc.freeze()
    frozen = gc.get_freeze_count()
    unfrozen: list[int] = []
    monkeypatch.setattr(gc, "unfreeze", lambda: unfrozen.append(gc.get_freeze_count()))
    settings = tune_gc(20_000)
    assert not settings.froze and gc.get_threshold()[0] == 20_000
    restore_gc(settings)
    assert unfrozen == [] and gc.get_freeze_count() > frozen // 2


def test_cycles_are_still_collected_under_the_raised_threshold() -> None:
    """Raised, not disabled: garbage cycles made after the freeze are freed by a young
    collection once the threshold's worth of allocations is reached."""
    with tuned_gc(1000):
        gc.collect()
        collected: list[int] = []

        def note(phase: str, info: dict[str, int]) -> None:
            if phase == "stop" and info["generation"] == 0:
                collected.append(info["collected"])

        gc.callbacks.append(note)
        try:
            for _ in range(5000):
                _Cycle()
        finally:
            gc.callbacks.remove(note)
    assert sum(collected) > 3000, collected


def test_tuned_gc_restores_after_an_error() -> None:
    before = gc.get_threshold()
    with pytest.raises(RuntimeError), tuned_gc():
        assert gc.get_threshold()[0] == DEFAULT_YOUNG_THRESHOLD
        raise RuntimeError("boom")
    assert gc.get_threshold() == before and gc.get_freeze_count() == 0


def test_the_worker_option_defaults_to_the_policy_and_refuses_a_negative(
    capsys: pytest.CaptureFixture[str],
) -> None:
    parser = worker_parser("worker", "lab.handler:lab_handler")
    assert parser.parse_args([]).gc_young_threshold == DEFAULT_YOUNG_THRESHOLD
    assert parser.parse_args(["--gc-young-threshold", "0"]).gc_young_threshold == 0
    with pytest.raises(SystemExit) as exit_:
        parser.parse_args(["--gc-young-threshold", "-5"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "--gc-young-threshold" in err and f"-5 is not within 0..{MAX_YOUNG_THRESHOLD}" in err


def test_the_relay_command_takes_the_option_too(capsys: pytest.CaptureFixture[str]) -> None:
    assert relay.main(["schema", "--dialect", "sqlite", "--gc-young-threshold", "0"]) == 0
    assert "CREATE TABLE" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exit_:
        relay.main(["schema", "--gc-young-threshold", "x"])
    assert exit_.value.code == 2
    assert "'x' is not an integer" in capsys.readouterr().err
