"""The topology guard through a cluster's transient answers (pure: a scripted management API).

For seconds after a quorum queue's leader's node fails, RabbitMQ 4.3's management API reports
the queue without its settings (no ``effective_policy_definition``, no ``policy``, ``state``
down); a booting node answers 500. CI saw workers refuse to consume on such a view ("DLQ is a
quorum queue with delivery-limit 20 (no policy)"): the guard asks again instead, and refuses
only what stays wrong."""

from __future__ import annotations

from typing import Any

import pytest

from amqp_lab.consuming import topology_guard
from amqp_lab.consuming.topology_guard import TopologyGuard, transient
from amqp_lab.errors import ManagementError, QueueViewIncomplete, RetryTopologyError
from amqp_lab.settings import BrokerSettings
from amqp_lab.topology.retry_check import (
    RetryExpectations,
    check_retry_topology,
    definite,
    incomplete_views,
)

pytestmark = [pytest.mark.unit, pytest.mark.timeout(30)]

EXPECT = RetryExpectations("v", "q:tasks", (), "", None, "q:tasks:dlq")
SETTINGS = BrokerSettings("amqp://guest:guest@127.0.0.1:1/v", "http://127.0.0.1:1")

FULL: dict[str, Any] = {  # what RabbitMQ 4.3 reports for our quorum DLQ (the keys the check reads)
    "name": "q:tasks:dlq",
    "type": "quorum",
    "durable": True,
    "auto_delete": False,
    "arguments": {"x-queue-type": "quorum"},
    "policy": "q-tasks-dlq",
    "operator_policy": None,
    "effective_policy_definition": {"delivery-limit": -1},
    "delivery_limit": "unlimited",
    "state": "running",
}
BETWEEN_LEADERS: dict[
    str, Any
] = {  # the 18-key view of the same queue 0.1 s after its leader was killed
    "name": "q:tasks:dlq",
    "type": "quorum",
    "durable": True,
    "auto_delete": False,
    "arguments": {"x-queue-type": "quorum"},
    "leader": "rabbit@rmq3",
    "state": "down",
}
WORK: dict[str, Any] = {
    "name": "q:tasks",
    "arguments": {},
    "effective_policy_definition": {},
    "policy": None,
}


class FakeApi:
    """check_retry_topology's view of the management API: the DLQ as ``dlq``, the work queue
    as ``work``; ``disable_stats`` as GET /api/overview reports it."""

    def __init__(
        self,
        dlq: dict[str, Any] | None,
        work: dict[str, Any] | None = WORK,
        disable_stats: bool = False,
    ) -> None:
        self.dlq, self.work, self.disable_stats = dlq, work, disable_stats

    def queue(self, vhost: str, name: str) -> dict[str, Any] | None:
        return self.dlq if name == "q:tasks:dlq" else self.work

    def overview(self) -> dict[str, Any]:
        return {"rabbitmq_version": "4.3.6", "disable_stats": self.disable_stats}


def test_a_view_without_its_settings_is_incomplete_and_a_missing_queue_is_not() -> None:
    views: dict[str, dict[str, Any] | None] = {
        "a": FULL,
        "b": BETWEEN_LEADERS,
        "c": None,
        "d": {"effective_policy_definition": {}},
    }
    assert incomplete_views(views) == ["b"]


def test_the_check_does_not_judge_a_queue_between_leaders() -> None:
    assert check_retry_topology(FakeApi(FULL), EXPECT) == []  # type: ignore[arg-type]
    with pytest.raises(QueueViewIncomplete) as raised:
        check_retry_topology(FakeApi(BETWEEN_LEADERS), EXPECT)  # type: ignore[arg-type]
    assert "'q:tasks:dlq' (quorum, down) without its settings" in str(raised.value)


def test_what_is_wrong_whatever_the_unknown_settings_is_still_refused() -> None:
    api = FakeApi(BETWEEN_LEADERS, work=None)
    found = check_retry_topology(api, EXPECT)  # type: ignore[arg-type]
    assert found == ["queue 'q:tasks' does not exist in vhost 'v'"]
    assert definite(
        ["DLQ 'q:tasks:dlq' is a quorum queue", "queue 'q:tasks' x"], ["q:tasks:dlq"]
    ) == ["queue 'q:tasks' x"]


def test_statistics_disabled_is_no_wait_but_a_clear_error() -> None:
    api = FakeApi(BETWEEN_LEADERS, disable_stats=True)
    with pytest.raises(ManagementError) as raised:
        check_retry_topology(api, EXPECT)  # type: ignore[arg-type]
    assert not isinstance(raised.value, QueueViewIncomplete) and not transient(raised.value)
    assert "statistics are disabled (management_agent.disable_metrics_collector" in str(
        raised.value
    )
    assert "'q:tasks:dlq' (quorum, down)" in str(raised.value)


@pytest.mark.parametrize(
    ("error", "expected"),
    [
        (QueueViewIncomplete("x"), True),
        (ManagementError("booting", 500), True),
        (ManagementError("unavailable", 503), True),
        (ManagementError("refused", 401), False),
        (ManagementError("unreachable"), False),
        (ValueError("other"), False),
    ],
)
def test_what_is_transient(error: BaseException, expected: bool) -> None:
    assert transient(error) is expected


class Scripted:
    """Replaces the guard's one ask: each call takes the next answer (a list of problems, or
    an exception to raise)."""

    def __init__(self, *answers: list[str] | BaseException) -> None:
        self.answers = list(answers)
        self.calls = 0

    def __call__(self, *api: object) -> list[str]:
        self.calls += 1
        answer = self.answers.pop(0)
        if isinstance(answer, BaseException):
            raise answer
        return answer


def guard(monkeypatch: pytest.MonkeyPatch, scripted: Scripted, settle: float = 30.0) -> Any:
    slept: list[float] = []
    g = TopologyGuard(SETTINGS, EXPECT, settle=settle, sleep=slept.append)
    monkeypatch.setattr(g, "_ask", scripted)
    return g, slept


def test_transient_answers_are_asked_again_until_the_cluster_settles(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    scripted = Scripted(QueueViewIncomplete("down"), ManagementError("booting", 500), [])
    g, slept = guard(monkeypatch, scripted)
    g.check()
    assert (scripted.calls, slept) == (3, [0.5, 0.5])


def test_a_consumer_waits_on_its_connection() -> None:
    waited: list[float] = []
    g = TopologyGuard(SETTINGS, EXPECT, sleep=lambda s: pytest.fail("the guard's own sleep"))
    g._ask = Scripted(QueueViewIncomplete("down"), [])  # type: ignore[method-assign,assignment]
    g.check(sleep=waited.append)
    assert waited == [0.5]


def test_a_real_problem_is_refused_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    scripted = Scripted(["DLQ 'q:tasks:dlq' drops records after message-ttl 1000 ms"], [])
    g, slept = guard(monkeypatch, scripted)
    with pytest.raises(RetryTopologyError, match="refusing to consume 'q:tasks': DLQ"):
        g.check()
    assert (scripted.calls, slept) == (1, [])


def test_a_wrong_password_is_not_waited_on(monkeypatch: pytest.MonkeyPatch) -> None:
    scripted = Scripted(ManagementError("refused user 'guest' (401)", 401))
    g, slept = guard(monkeypatch, scripted)
    with pytest.raises(RetryTopologyError, match="cannot check the retry topology"):
        g.check()
    assert (scripted.calls, slept) == (1, [])


def test_a_cluster_that_does_not_settle_ends_in_a_clear_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    scripted = Scripted(QueueViewIncomplete("'q:tasks:dlq' (down) without its settings"))
    g, _ = guard(monkeypatch, scripted, settle=0.0)
    with pytest.raises(RetryTopologyError) as raised:
        g.check()
    assert "cannot check the retry topology and the DLQ of vhost 'v'" in str(raised.value)
    assert "without its settings" in str(raised.value)
    assert isinstance(raised.value.__cause__, QueueViewIncomplete)


def test_after_a_good_check_a_transient_answer_is_a_warning_not_a_wait(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    scripted = Scripted([], QueueViewIncomplete("down"), ["a real problem"])
    g, slept = guard(monkeypatch, scripted)
    g.check()
    with caplog.at_level("WARNING", logger=topology_guard.__name__):
        g.check()
    assert (scripted.calls, slept) == (2, [])
    assert "cannot re-check the topology: down" in caplog.text
    with pytest.raises(RetryTopologyError, match="a real problem"):
        g.check()  # what stays wrong is refused on a later connection all the same


def test_a_stop_during_the_wait_ends_the_check_without_an_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    scripted = Scripted(QueueViewIncomplete("down"), QueueViewIncomplete("down"), [])
    g, slept = guard(monkeypatch, scripted)
    stops = iter([False, True])
    g.check(stopping=lambda: next(stops, True))
    assert (scripted.calls, slept) == (2, [0.5])
    assert not g._verified  # nothing was checked: the next connection checks again


def test_a_stop_does_not_hide_a_real_problem(monkeypatch: pytest.MonkeyPatch) -> None:
    g, _ = guard(monkeypatch, Scripted(["a real problem"]))
    with pytest.raises(RetryTopologyError, match="a real problem"):
        g.check(stopping=lambda: True)


def test_the_wait_is_one_warning_then_debug_lines(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    down = [QueueViewIncomplete("down") for _ in range(3)]
    g, slept = guard(monkeypatch, Scripted(*down, []))
    with caplog.at_level("DEBUG", logger=topology_guard.__name__):
        g.check()
    levels = [r.levelname for r in caplog.records if "asking again" in r.message]
    assert (levels, slept) == (["WARNING", "DEBUG", "DEBUG"], [0.5, 0.5, 0.5])


def test_no_ask_starts_after_the_settle_time(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = [0.0]

    def sleep(seconds: float) -> None:
        clock[0] += seconds

    monkeypatch.setattr("tenacity.time.monotonic", lambda: clock[0])
    scripted = Scripted(*[QueueViewIncomplete("down") for _ in range(100)])
    g = TopologyGuard(SETTINGS, EXPECT, settle=30.0, sleep=sleep)
    monkeypatch.setattr(g, "_ask", scripted)
    with pytest.raises(RetryTopologyError, match="cannot check"):
        g.check()
    assert scripted.calls == 60 and clock[0] == 29.5


def test_a_connection_that_closes_during_the_wait_ends_the_check_with_pika_s_error() -> None:
    """The consumer waits on ``connection.sleep``, which raises when the broker closes the
    connection: the guard neither waits on nor judges anything more, and the pika error
    reaches the consumer's ``translate`` (a ConnectionLost: reconnect, and check again)."""
    import pika.exceptions as pe

    from amqp_lab.connection import translate
    from amqp_lab.errors import ConnectionLost

    def closed(seconds: float) -> None:
        raise pe.ConnectionClosedByBroker(320, "CONNECTION_FORCED - broker forced close")

    g = TopologyGuard(SETTINGS, EXPECT, sleep=lambda s: pytest.fail("the guard's own sleep"))
    scripted = Scripted(QueueViewIncomplete("down"), [])
    g._ask = scripted  # type: ignore[method-assign,assignment]
    with pytest.raises(pe.ConnectionClosedByBroker) as raised:
        g.check(sleep=closed)
    assert scripted.calls == 1 and not g._verified
    assert isinstance(translate(raised.value, SETTINGS), ConnectionLost)
