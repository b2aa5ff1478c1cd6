"""Several broker addresses (a cluster's nodes): the comma-separated URL list, its masking,
the order nodes are tried in, and the management client moving on from a dead node."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any

import pika
import pika.exceptions as pe
import pytest

import amqp_lab.connection as connection_module
from amqp_lab.connection import address_order
from amqp_lab.errors import (
    AuthenticationFailed,
    BrokerUnavailable,
    ConfigurationError,
    ManagementError,
    VhostAccessDenied,
)
from amqp_lab.management import ManagementClient
from amqp_lab.settings import BrokerSettings, mask_url

pytestmark = pytest.mark.unit

LIST = (
    "amqp://app:s3cret@rmq1:5701/prod,amqp://app:s3cret@rmq2:5702/prod, amqp://app:s3cret@rmq3/prod"
)


def test_a_list_gives_every_node_and_the_first_as_host_and_port() -> None:
    settings = BrokerSettings(LIST)
    assert settings.amqp_urls == (
        "amqp://app:s3cret@rmq1:5701/prod",
        "amqp://app:s3cret@rmq2:5702/prod",
        "amqp://app:s3cret@rmq3/prod",
    )
    assert (settings.host, settings.port, settings.vhost) == ("rmq1", 5701, "prod")
    assert [(a.host, a.port) for a in settings.addresses()] == [
        ("rmq1", 5701),
        ("rmq2", 5702),
        ("rmq3", 5672),
    ]


def test_a_single_url_is_a_list_of_one() -> None:
    settings = BrokerSettings("amqp://app:pw@rabbit:5672/%2F")
    assert settings.amqp_urls == ("amqp://app:pw@rabbit:5672/%2F",)
    assert settings.addresses() == (settings,)


def test_a_comma_inside_a_password_does_not_split_the_url() -> None:
    settings = BrokerSettings("amqp://app:pa,ss@rmq1/v,amqp://app:pa,ss@rmq2/v")
    assert [a.host for a in settings.addresses()] == ["rmq1", "rmq2"]
    assert settings.password == "pa,ss"
    assert "pa,ss" not in settings.masked_url


def test_the_list_is_masked_url_by_url() -> None:
    masked = BrokerSettings(LIST).masked_url
    assert "s3cret" not in masked
    assert masked == (
        "amqp://app:***@rmq1:5701/prod, amqp://app:***@rmq2:5702/prod, amqp://app:***@rmq3/prod"
    )
    assert mask_url("at amqp://a:x@h1/v,amqp://a:y@h2/v: refused") == (
        "at amqp://a:***@h1/v,amqp://a:***@h2/v: refused"
    )


@pytest.mark.parametrize(
    "url",
    [
        pytest.param("amqp://app:pw@rmq1/prod,amqp://app:pw@rmq2/test", id="other-vhost"),
        pytest.param("amqp://app:pw@rmq1/prod,amqp://other:pw@rmq2/prod", id="other-user"),
        pytest.param("amqp://app:pw@rmq1/prod,amqp://app:s3cret@rmq2/prod", id="other-password"),
    ],
)
def test_nodes_of_one_list_share_vhost_and_credentials(url: str) -> None:
    with pytest.raises(ConfigurationError, match="same") as raised:
        BrokerSettings(url)
    assert "s3cret" not in str(raised.value)


def test_a_bad_url_in_the_list_is_named() -> None:
    with pytest.raises(ConfigurationError, match="rmq2"):
        BrokerSettings("amqp://app:pw@rmq1/v,amqp://app:pw@rmq2:notaport/v")


def test_management_bases_derive_from_each_node_or_follow_the_list() -> None:
    assert BrokerSettings(LIST).management_bases == (
        "http://rmq1:15672",
        "http://rmq2:15672",
        "http://rmq3:15672",
    )
    given = BrokerSettings(LIST, "http://u:p@127.0.0.1:15701,http://127.0.0.1:15702")
    assert given.management_bases == ("http://127.0.0.1:15701", "http://127.0.0.1:15702")
    assert given.management_credentials == ("u", "p")
    assert [a.management_base for a in given.addresses()] == [
        "http://127.0.0.1:15701",
        "http://127.0.0.1:15702",
        "http://rmq3:15672",
    ]


def test_with_vhost_moves_every_node() -> None:
    moved = BrokerSettings(LIST).with_vhost("a/b")
    assert [a.vhost for a in moved.addresses()] == ["a/b"] * 3
    assert moved.amqp_urls[1] == "amqp://app:s3cret@rmq2:5702/a%2Fb"


@pytest.mark.parametrize("start", [0, 1, 2, 5])
def test_address_order_tries_each_node_once_from_the_start(start: int) -> None:
    order = address_order(3, start)
    assert sorted(order) == [0, 1, 2]
    assert order[0] == start % 3
    assert order == [(start + i) % 3 for i in range(3)]


def test_address_order_starts_at_random_nodes() -> None:
    firsts = {address_order(3)[0] for _ in range(200)}
    assert firsts == {0, 1, 2}


# --- the management client on a list ---------------------------------------------------------
class _Overview(BaseHTTPRequestHandler):
    calls = 0

    def do_GET(self) -> None:
        type(self).calls += 1
        body = json.dumps({"rabbitmq_version": "4.3.6", "path": self.path}).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


def _serve(handler: type[BaseHTTPRequestHandler]) -> Iterator[str]:
    """An HTTP server on a free local port answering with ``handler``: its base URL."""
    server = HTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.fixture
def live_base() -> Iterator[str]:
    yield from _serve(_Overview)


def _dead_base() -> str:
    with socket.socket() as s:  # a port nothing listens on once closed
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}"


@pytest.mark.timeout(30)
def test_management_client_moves_on_from_a_dead_node_and_stays(live_base: str) -> None:
    dead = _dead_base()
    settings = BrokerSettings("amqp://u:pw@a/v,amqp://u:pw@b/v", f"{dead},{live_base}")
    with ManagementClient(settings, timeout=5) as api:
        assert api.overview()["rabbitmq_version"] == "4.3.6"
        assert api.base == live_base
        before = _Overview.calls
        api.overview()
        assert _Overview.calls == before + 1
        assert api.base == live_base


@pytest.mark.timeout(30)
def test_management_client_names_every_dead_node() -> None:
    first, second = _dead_base(), _dead_base()
    settings = BrokerSettings("amqp://u:s3cret@a/v", f"http://u:s3cret@{first[7:]},{second}")
    with ManagementClient(settings, timeout=5) as api, pytest.raises(ManagementError) as raised:
        api.overview()
    assert first in str(raised.value) and second in str(raised.value)
    assert "s3cret" not in str(raised.value)


class _Booting(BaseHTTPRequestHandler):
    """A node that is booting or rejoining: every request answered 500."""

    calls = 0

    def _answer(self) -> None:
        type(self).calls += 1
        self.send_response(500)
        self.send_header("content-length", "0")
        self.end_headers()

    do_GET = do_PUT = _answer

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def booting_base() -> Iterator[str]:
    yield from _serve(_Booting)


@pytest.mark.timeout(30)
def test_a_get_answered_500_moves_on_and_a_put_does_not(live_base: str, booting_base: str) -> None:
    settings = BrokerSettings("amqp://u:pw@a/v,amqp://u:pw@b/v", f"{booting_base},{live_base}")
    with ManagementClient(settings, timeout=5) as api:
        assert api.overview()["rabbitmq_version"] == "4.3.6"
        assert api.base == live_base
    with ManagementClient(settings, timeout=5) as api, pytest.raises(ManagementError) as raised:
        api.put_policy("v", "p", ".*", {"max-length": 1})  # never sent twice
    assert raised.value.status_code == 500 and api.base == booting_base
    alone = BrokerSettings("amqp://u:pw@a/v,amqp://u:pw@b/v", f"{booting_base},{booting_base}")
    before = _Booting.calls
    with ManagementClient(alone, timeout=5) as api, pytest.raises(ManagementError) as raised:
        api.overview()
    assert raised.value.status_code == 500 and _Booting.calls == before + 2


# --- connect over a list: one attempt per node, the right error --------------------------------
_OUTCOMES: dict[str, BaseException | None] = {}


class _FakeConnection:
    """Stands in for pika.BlockingConnection: each host fails as _OUTCOMES says, or opens."""

    def __init__(self, parameters: Any) -> None:
        outcome = _OUTCOMES[parameters.host]
        if outcome is not None:
            raise outcome
        self.host = parameters.host


@pytest.fixture
def fake_pika(monkeypatch: pytest.MonkeyPatch) -> dict[str, BaseException | None]:
    monkeypatch.setattr(pika, "BlockingConnection", _FakeConnection)
    _OUTCOMES.clear()
    return _OUTCOMES


def _listed(*hosts: str) -> BrokerSettings:
    return BrokerSettings(",".join(f"amqp://app:s3cret@{h}:5672/v" for h in hosts))


def test_an_unresolvable_node_does_not_stop_the_list(fake_pika: dict[str, Any]) -> None:
    fake_pika.update({"gone": socket.gaierror(-2, "Name or service not known"), "live": None})
    for _ in range(10):  # whichever node comes first
        assert connection_module.connect(_listed("gone", "live")).host == "live"


def test_a_wrong_password_is_reported_as_such_whatever_the_other_nodes_do(
    fake_pika: dict[str, Any],
) -> None:
    fake_pika.update({"auth": pe.ProbableAuthenticationError(), "dead": pe.AMQPConnectionError()})
    for _ in range(10):
        with pytest.raises(AuthenticationFailed) as raised:
            connection_module.connect(_listed("auth", "dead"))
        assert "s3cret" not in str(raised.value)


def test_a_vhost_refused_by_the_nodes_that_answered_wins_over_dead_nodes(
    fake_pika: dict[str, Any],
) -> None:
    fake_pika.update({"refuses": pe.ProbableAccessDeniedError(), "dead": pe.AMQPConnectionError()})
    for _ in range(10):
        with pytest.raises(VhostAccessDenied):
            connection_module.connect(_listed("dead", "refuses"))


def test_no_node_answering_names_every_node(fake_pika: dict[str, Any]) -> None:
    fake_pika.update({"a": pe.AMQPConnectionError("refused"), "b": socket.gaierror(-2, "no name")})
    with pytest.raises(BrokerUnavailable) as raised:
        connection_module.connect(_listed("a", "b"))
    text = str(raised.value)
    assert "@a:5672" in text and "@b:5672" in text and "s3cret" not in text


def test_one_unresolvable_node_alone_is_broker_unavailable(fake_pika: dict[str, Any]) -> None:
    fake_pika.update({"gone": socket.gaierror(-2, "Name or service not known")})
    with pytest.raises(BrokerUnavailable, match="cannot connect"):
        connection_module.connect(_listed("gone"))


def test_a_trailing_comma_is_refused_not_taken_into_the_vhost() -> None:
    with pytest.raises(ConfigurationError, match="ends with a comma") as raised:
        BrokerSettings("amqp://app:s3cret@rmq1/prod,amqp://app:s3cret@rmq2/prod,")
    assert "s3cret" not in str(raised.value)
