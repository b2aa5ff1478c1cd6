"""The check a consumer runs at every connection, before it consumes: the live policies of
its vhost must bring a retry back and keep every DLQ record
(:mod:`amqp_lab.topology.retry_check`; the management API, operator policies included)."""

from __future__ import annotations

import logging

from amqp_lab.errors import ManagementError, RetryTopologyError
from amqp_lab.management import ManagementClient
from amqp_lab.settings import BrokerSettings
from amqp_lab.topology.retry_check import RetryExpectations, check_retry_topology

__all__ = ["TopologyGuard"]

log = logging.getLogger(__name__)


class TopologyGuard:
    """Checks ``expect`` in ``settings.vhost`` when :meth:`check` is called (at every
    connection); ``enabled`` False skips it (``verify_topology=False``, worker.py
    ``--no-verify-topology``)."""

    def __init__(
        self, settings: BrokerSettings, expect: RetryExpectations, enabled: bool = True
    ) -> None:
        self.settings = settings
        self.expect = expect
        self.enabled = enabled
        self._verified = False

    def check(self) -> None:
        """Raise RetryTopologyError naming every problem and the policy in force (one line),
        or when the management API cannot be asked before the first successful check; after
        one, an API outage is a warning (the settings were right a connection ago)."""
        if not self.enabled:
            return
        try:
            with ManagementClient(self.settings) as api:
                found = check_retry_topology(api, self.expect)
        except ManagementError as e:
            if self._verified:
                log.warning("cannot re-check the topology: %s", e)
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
