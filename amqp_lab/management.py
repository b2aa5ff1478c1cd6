"""The RabbitMQ management HTTP API (https://www.rabbitmq.com/docs/management#http-api).

Thin methods over httpx for what amqp-lab needs: vhosts, permissions, policies, queues,
bindings, connections and node stats. Errors become :class:`~amqp_lab.errors.ManagementError`
with the masked URL; a password never appears in a message.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

import httpx

from amqp_lab.errors import ManagementError
from amqp_lab.settings import BrokerSettings, mask_secrets

__all__ = [
    "ManagementClient",
]


def _policy_body(
    pattern: str, definition: dict[str, Any], priority: int, apply_to: str
) -> dict[str, Any]:
    return {
        "pattern": pattern,
        "definition": definition,
        "priority": priority,
        "apply-to": apply_to,
    }


def _q(name: str) -> str:
    """Percent-encode a vhost, queue or policy name as one path segment (``/`` -> ``%2F``)."""
    return quote(name, safe="")


class ManagementClient:
    """Management API client for one broker, or for a cluster through any of its nodes.
    ``timeout`` is in seconds. Use as a context manager or call :meth:`close`.

    With several management bases (``settings.management_bases``: a cluster), a request that
    gets no answer from the current node (connection refused, timeout) is sent to the next one,
    and the client stays on the node that answered (whatever the method: a write that timed out
    may have been applied, and is sent again; every write here is an idempotent PUT or DELETE).
    A GET answered with a 5xx status goes to the next node too: a node that is booting or
    rejoining answers 500 for seconds while the others can answer (seen on RabbitMQ 4.3 after
    a node restart); the first 5xx is returned when no node answers better. Any other HTTP
    error status is the broker's answer and is never retried elsewhere."""

    def __init__(self, settings: BrokerSettings, timeout: float = 10.0) -> None:
        self.settings = settings
        self._bases = settings.management_bases
        self._current = 0
        self._password = settings.management_credentials[1]
        self._clients = [
            httpx.Client(
                base_url=base + "/api",
                auth=settings.management_credentials,
                timeout=timeout,
                headers={"content-type": "application/json"},
            )
            for base in self._bases
        ]

    @property
    def base(self) -> str:
        """The management API base in use (the node that answered last)."""
        return self._bases[self._current]

    def __enter__(self) -> ManagementClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        for client in self._clients:
            client.close()

    # --- plumbing --------------------------------------------------------------------------------
    def _send(self, method: str, path: str, json: Any) -> httpx.Response:
        """The request on the current node, else on each other node in turn. Raises
        ManagementError when none answers."""
        errors: list[str] = []
        last: httpx.HTTPError | None = None
        failed: tuple[int, httpx.Response] | None = None  # a GET a node answered with 5xx
        for step in range(len(self._clients)):
            index = (self._current + step) % len(self._clients)
            try:
                response = self._clients[index].request(method, path, json=json)
            except httpx.TransportError as e:
                errors.append(f"{self._bases[index]} ({type(e).__name__}: {e})")
                last = e
                continue
            except httpx.HTTPError as e:
                errors.append(f"{self._bases[index]} ({type(e).__name__}: {e})")
                last = e
                break
            if method == "GET" and response.status_code >= 500 and len(self._clients) > 1:
                failed = failed or (index, response)
                continue
            self._current = index
            return response
        if failed is not None:
            self._current = failed[0]
            return failed[1]
        raise ManagementError(
            mask_secrets(
                f"management API unreachable at {'; '.join(errors)}; is the "
                "rabbitmq_management plugin enabled? set EAI_MGMT_URL if it is not on port 15672",
                self._password,
            )
        ) from last

    def _request(self, method: str, path: str, json: Any = None, ok404: bool = False) -> Any:
        response = self._send(method, path, json)
        if response.status_code == 404 and ok404:
            return None
        if response.status_code == 401:
            user = self.settings.management_credentials[0]
            raise ManagementError(
                f"management API at {self.base} refused user {user!r} (401): a wrong password, "
                "or the user has no management tag (setup_topology.py needs 'policymaker')",
                401,
            )
        if response.status_code >= 400:
            reason = response.text[:300].replace("\n", " ")
            raise ManagementError(
                mask_secrets(
                    f"management API {method} {path} -> {response.status_code}: {reason}",
                    self._password,
                ),
                response.status_code,
            )
        if not response.content:
            return None
        return response.json()

    # --- reads -----------------------------------------------------------------------------------
    def overview(self) -> dict[str, Any]:
        """GET /api/overview (broker version under ``rabbitmq_version``)."""
        result: dict[str, Any] = self._request("GET", "/overview")
        return result

    def nodes(self) -> list[dict[str, Any]]:
        """GET /api/nodes: one dict per node; ``mem_limit`` is in bytes."""
        result: list[dict[str, Any]] = self._request("GET", "/nodes")
        return result

    def whoami(self) -> dict[str, Any]:
        """GET /api/whoami: the user and its tags."""
        result: dict[str, Any] = self._request("GET", "/whoami")
        return result

    def queue(self, vhost: str, name: str) -> dict[str, Any] | None:
        """GET /api/queues/{vhost}/{name}, or None if it does not exist. Counters such as
        ``messages_ready`` / ``messages_unacknowledged`` lag by the statistics interval."""
        result: dict[str, Any] | None = self._request(
            "GET", f"/queues/{_q(vhost)}/{_q(name)}", ok404=True
        )
        return result

    def queues(self, vhost: str) -> list[dict[str, Any]]:
        result: list[dict[str, Any]] = self._request("GET", f"/queues/{_q(vhost)}")
        return result

    def exchange(self, vhost: str, name: str) -> dict[str, Any] | None:
        result: dict[str, Any] | None = self._request(
            "GET", f"/exchanges/{_q(vhost)}/{_q(name)}", ok404=True
        )
        return result

    def exchange_bindings(self, vhost: str, exchange: str) -> list[dict[str, Any]]:
        """GET /api/exchanges/{vhost}/{name}/bindings/source: the bindings from ``exchange``."""
        result: list[dict[str, Any]] = self._request(
            "GET", f"/exchanges/{_q(vhost)}/{_q(exchange)}/bindings/source"
        )
        return result

    def bindings(self, vhost: str) -> list[dict[str, Any]]:
        """GET /api/bindings/{vhost} (includes the default exchange's implicit bindings)."""
        result: list[dict[str, Any]] = self._request("GET", f"/bindings/{_q(vhost)}")
        return result

    def policy(self, vhost: str, name: str) -> dict[str, Any] | None:
        """GET /api/policies/{vhost}/{name}, or None. Needs the ``policymaker`` tag."""
        result: dict[str, Any] | None = self._policy_request("GET", vhost, name, None, ok404=True)
        return result

    def connections(self, vhost: str | None = None) -> list[dict[str, Any]]:
        path = f"/vhosts/{_q(vhost)}/connections" if vhost is not None else "/connections"
        result: list[dict[str, Any]] = self._request("GET", path)
        return result

    # --- writes ----------------------------------------------------------------------------------
    def put_policy(
        self,
        vhost: str,
        name: str,
        pattern: str,
        definition: dict[str, Any],
        priority: int = 0,
        apply_to: str = "queues",
    ) -> None:
        """PUT /api/policies/{vhost}/{name}. Needs the ``policymaker`` (or administrator) tag."""
        body = _policy_body(pattern, definition, priority, apply_to)
        self._policy_request("PUT", vhost, name, body)

    def put_operator_policy(
        self,
        vhost: str,
        name: str,
        pattern: str,
        definition: dict[str, Any],
        priority: int = 0,
        apply_to: str = "queues",
    ) -> None:
        """PUT /api/operator-policies/{vhost}/{name}: merged over the queues' own policy
        (https://www.rabbitmq.com/docs/policies#operator-policies). Needs the administrator tag."""
        body = _policy_body(pattern, definition, priority, apply_to)
        self._request("PUT", f"/operator-policies/{_q(vhost)}/{_q(name)}", json=body)

    def delete_policy(self, vhost: str, name: str) -> None:
        """DELETE /api/policies/{vhost}/{name}; a missing policy is not an error."""
        self._policy_request("DELETE", vhost, name, None, ok404=True)

    def _policy_request(
        self, method: str, vhost: str, name: str, body: Any, ok404: bool = False
    ) -> Any:
        """A /api/policies call whose 401/403 names the missing tag."""
        try:
            return self._request(method, f"/policies/{_q(vhost)}/{_q(name)}", body, ok404)
        except ManagementError as e:
            if e.status_code in (401, 403):
                user = self.settings.management_credentials[0]
                raise ManagementError(
                    f"cannot {'read' if method == 'GET' else 'set'} policy {name!r} on vhost "
                    f"{vhost!r}: user {user!r} needs the 'policymaker' tag "
                    f"(rabbitmqctl set_user_tags {user} policymaker)",
                    e.status_code,
                ) from e
            raise

    def create_vhost(self, vhost: str) -> None:
        """PUT /api/vhosts/{vhost} (idempotent)."""
        self._request("PUT", f"/vhosts/{_q(vhost)}", json={})

    def delete_vhost(self, vhost: str) -> None:
        """DELETE /api/vhosts/{vhost}; a missing vhost is not an error."""
        self._request("DELETE", f"/vhosts/{_q(vhost)}", ok404=True)

    def set_permissions(
        self, vhost: str, user: str, configure: str = ".*", write: str = ".*", read: str = ".*"
    ) -> None:
        """PUT /api/permissions/{vhost}/{user} (regexes over resource names)."""
        self._request(
            "PUT",
            f"/permissions/{_q(vhost)}/{_q(user)}",
            json={"configure": configure, "write": write, "read": read},
        )

    def delete_permissions(self, vhost: str, user: str) -> None:
        """DELETE /api/permissions/{vhost}/{user}; missing permissions are not an error."""
        self._request("DELETE", f"/permissions/{_q(vhost)}/{_q(user)}", ok404=True)

    def create_user(self, name: str, password: str, tags: str = "") -> None:
        """PUT /api/users/{name}; ``tags`` comma-separated (management, policymaker, ...)."""
        self._request("PUT", f"/users/{_q(name)}", json={"password": password, "tags": tags})

    def delete_user(self, name: str) -> None:
        """DELETE /api/users/{name}; a missing user is not an error."""
        self._request("DELETE", f"/users/{_q(name)}", ok404=True)

    def close_connection(self, name: str, reason: str = "closed by amqp-lab") -> None:
        """DELETE /api/connections/{name}: the broker force-closes it (320 CONNECTION_FORCED)."""
        for client in self._clients:
            client.headers["X-Reason"] = reason
        try:
            self._request("DELETE", f"/connections/{_q(name)}", ok404=True)
        finally:
            for client in self._clients:
                del client.headers["X-Reason"]
