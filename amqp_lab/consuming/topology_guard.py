"""The check a consumer runs at every connection, before it consumes: the live policies of
its vhost must bring a retry back and keep every DLQ record
(:mod:`amqp_lab.topology.retry_check`; the management API, operator policies included).

A cluster answers unevenly for seconds after a node fails: a quorum queue between leaders is
reported without its settings (QueueViewIncomplete) and a node that is booting answers 500.
Neither says the topology is wrong, so neither refuses: the check asks again, 0.5 s apart, for
up to ``settle`` seconds (found on a three-node RabbitMQ 4.3 cluster, where a restarted
worker read the DLQ "without a policy" 9 s after its leader's node was killed and refused to
consume)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from tenacity import RetryCallState, Retrying, retry_if_exception, stop_before_delay, wait_fixed

from amqp_lab.errors import ManagementError, QueueViewIncomplete, RetryTopologyError
from amqp_lab.management import ManagementClient
from amqp_lab.settings import BrokerSettings
from amqp_lab.topology.retry_check import RetryExpectations, check_retry_topology

__all__ = ["SETTLE_SECONDS", "TopologyGuard", "transient"]

log = logging.getLogger(__name__)

SETTLE_SECONDS = 30.0
"""How long a check asks again while the cluster's answers are transient (seconds): a quorum
leader election takes 2-5 s on an idle cluster, a rejoining node's API 5-10 s."""


def transient(error: BaseException) -> bool:
    """A management answer that can change in seconds without anyone acting: a queue view
    without its settings, or a 5xx status."""
    if isinstance(error, QueueViewIncomplete):
        return True
    code = error.status_code if isinstance(error, ManagementError) else None
    return code is not None and code >= 500


class TopologyGuard:
    """Checks ``expect`` in ``settings.vhost`` when :meth:`check` is called (at every
    connection); ``enabled`` False skips it (``verify_topology=False``, worker.py
    ``--no-verify-topology``). ``settle``: seconds to keep asking through transient answers
    (:func:`transient`); ``sleep`` is injected for tests."""

    def __init__(
        self,
        settings: BrokerSettings,
        expect: RetryExpectations,
        enabled: bool = True,
        settle: float = SETTLE_SECONDS,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.settings = settings
        self.expect = expect
        self.enabled = enabled
        self.settle = settle
        self.sleep = sleep
        self._verified = False

    def _ask(self, api: ManagementClient) -> list[str]:
        return check_retry_topology(api, self.expect)

    def _ask_until_settled(
        self, sleep: Callable[[float], None], stopping: Callable[[], bool]
    ) -> list[str]:
        """:meth:`_ask`, again while its answer is transient, up to ``settle`` seconds (no
        ask starts after them), on one client: it stays on the node that answered last. A
        transient answer after a successful check, or once ``stopping()``, ends the wait at
        once (re-raised). The first transient answer is a warning, the later ones debug."""

        def again(state: RetryCallState) -> None:
            error = state.outcome.exception() if state.outcome else None
            level = logging.WARNING if state.attempt_number == 1 else logging.DEBUG
            log.log(level, "topology check: %s; asking again for up to %g s", error, self.settle)

        retrying = Retrying(
            retry=retry_if_exception(
                lambda e: transient(e) and not self._verified and not stopping()
            ),
            stop=stop_before_delay(self.settle),
            wait=wait_fixed(0.5),
            sleep=sleep,
            before_sleep=again,
            reraise=True,
        )
        with ManagementClient(self.settings) as api:
            return retrying(self._ask, api)

    def check(
        self,
        sleep: Callable[[float], None] | None = None,
        stopping: Callable[[], bool] = lambda: False,
    ) -> None:
        """Raise RetryTopologyError naming every problem and the policy in force (one line),
        or when the management API cannot be asked before the first successful check (after
        ``settle`` seconds of transient answers); after one, an API outage or a transient
        answer is a warning (the settings were right a connection ago). ``sleep``: how to wait
        between asks (a consumer passes its connection's ``sleep``, which keeps heartbeats
        going); default the guard's own. Once ``stopping()`` (a drain asked for meanwhile)
        a transient answer ends the check without an error: the caller consumes nothing."""
        if not self.enabled:
            return
        try:
            found = self._ask_until_settled(sleep or self.sleep, stopping)
        except ManagementError as e:
            if self._verified:
                log.warning("cannot re-check the topology: %s", e)
                return
            if transient(e) and stopping():
                log.info("the topology check ended by the stop: %s", e)
                return
            raise RetryTopologyError(
                f"cannot check the retry topology and the DLQ of vhost "
                f"{self.settings.vhost!r} ({e}); verify_topology=False (worker.py "
                "--no-verify-topology) runs without the check"
            ) from e
        if found:
            raise RetryTopologyError(
                f"refusing to consume {self.expect.queue!r}: " + "; ".join(found)
            )
        self._verified = True
