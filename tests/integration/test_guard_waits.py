"""The worker's topology guard through a management API that answers without queue settings
(a quorum queue between leaders reads so for seconds after a node fails; statistics not yet
collected read so too): the worker waits on its connection and then consumes, and a SIGTERM
during the wait is a clean stop. The API is the broker's own behind a proxy that strips
``policy`` and ``effective_policy_definition`` from queue views while told to."""

from __future__ import annotations

import json
import signal
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

from amqp_lab.settings import BrokerSettings
from amqp_lab.topology import apply_topology, load_topology, with_queue_type
from tests.support import parse_lines, publish, start_script

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


BETWEEN_LEADERS = (  # the keys of RabbitMQ 4.3's view of a quorum queue between leaders
    "arguments", "auto_delete", "consumer_details", "deliveries", "durable", "exclusive",
    "garbage_collection", "incoming", "internal", "internal_owner", "leader", "members",
    "name", "node", "online", "state", "type", "vhost",
)  # fmt: skip


class StrippingProxy:
    """An HTTP proxy to ``base`` (a management API): GETs go through, and while
    :attr:`stripping` a queue view keeps only what RabbitMQ 4.3 reports between two quorum
    leaders (measured: :data:`BETWEEN_LEADERS`)."""

    def __init__(self, base: str) -> None:
        self.base, self.stripping, self.stripped = base, True, 0
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                upstream = httpx.get(
                    proxy.base + self.path,
                    headers={"authorization": self.headers.get("authorization", "")},
                    timeout=10,
                )
                body = upstream.content
                if proxy.stripping and self.path.startswith("/api/queues/") and body:
                    view: dict[str, Any] = json.loads(body)
                    view = {k: v for k, v in view.items() if k in BETWEEN_LEADERS}
                    view["state"] = "down"
                    proxy.stripped += 1
                    body = json.dumps(view).encode()
                self.send_response(upstream.status_code)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def proxied(vhost: BrokerSettings) -> Iterator[tuple[BrokerSettings, StrippingProxy]]:
    """The vhost with the quorum topology (its DLQ: delivery-limit -1 by policy, which a view
    without settings hides), its management API behind a StrippingProxy."""
    apply_topology(vhost, with_queue_type(load_topology(), "quorum"))
    assert vhost.management_url is not None
    proxy = StrippingProxy(vhost.management_bases[0])
    yield BrokerSettings(vhost.amqp_url, proxy.url), proxy
    proxy.close()


def _wait_until(proxy: StrippingProxy, views: int, proc: Any) -> None:
    """Until the worker has read ``views`` queue views without settings; fails when it
    exits first (it refused to consume) or never asks."""
    deadline = time.monotonic() + 30
    while proxy.stripped < views:
        if proc.poll() is not None:
            pytest.fail(f"the worker exited {proc.returncode}: {proc.communicate()[1]}")
        assert time.monotonic() < deadline, "the worker never asked the management API"
        time.sleep(0.05)


def test_the_worker_waits_for_the_settings_then_consumes(
    proxied: tuple[BrokerSettings, StrippingProxy], tmp_path: Path
) -> None:
    settings, proxy = proxied
    publish(settings, ("ok", "m-1"))
    proc = start_script(
        settings, "worker.py", "--idle-exit", "1.5", "--dedup-path", str(tmp_path / "d.sqlite3")
    )
    _wait_until(proxy, 6, proc)  # three asks without settings: it waited, it did not refuse
    proxy.stripping = False
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert [(r["message_id"], r["outcome"]) for r in parse_lines(out)] == [("m-1", "processed")]
    asked = [line for line in err.splitlines() if "asking again" in line]
    assert len(asked) == 1 and "without its settings" in asked[0], err  # one warning
    assert "refusing" not in err


def test_sigterm_during_the_wait_is_a_clean_stop(
    proxied: tuple[BrokerSettings, StrippingProxy], tmp_path: Path
) -> None:
    settings, proxy = proxied
    publish(settings, ("ok", "m-1"))
    proc = start_script(settings, "worker.py", "--dedup-path", str(tmp_path / "d.sqlite3"))
    _wait_until(proxy, 4, proc)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert out.splitlines()[-1] == "worker stopped (SIGTERM received): 0 deliveries handled"
    assert "error" not in err.lower(), err
