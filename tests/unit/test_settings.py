"""BrokerSettings: AMQP URL parsing, secret masking, management API base and credentials."""

from __future__ import annotations

import pytest

from amqp_lab.errors import ConfigurationError
from amqp_lab.settings import BrokerSettings, mask_secrets, mask_url

pytestmark = pytest.mark.unit

SECRET = "s3cr3t-Pw"


# --- vhost, host, port, credentials ------------------------------------------------------------
@pytest.mark.parametrize(
    ("url", "vhost"),
    [
        pytest.param("amqp://app:pw@rabbit:5672/%2F", "/", id="percent-encoded-slash"),
        pytest.param("amqp://app:pw@rabbit:5672/%2f", "/", id="lowercase-percent-encoding"),
        pytest.param("amqp://app:pw@rabbit:5672", "/", id="empty-path"),
        pytest.param("amqp://app:pw@rabbit:5672/", "/", id="bare-slash"),
        pytest.param("amqp://app:pw@rabbit:5672/prod", "prod", id="plain-name"),
        pytest.param("amqp://app:pw@rabbit/team%2Fprod", "team/prod", id="slash-inside-name"),
        pytest.param("amqp://app:pw@rabbit/my%20vhost", "my vhost", id="space"),
    ],
)
def test_vhost_is_the_decoded_url_path(url: str, vhost: str) -> None:
    assert BrokerSettings(url).vhost == vhost


@pytest.mark.parametrize(
    ("url", "scheme", "port"),
    [
        ("amqp://app:pw@rabbit/v", "amqp", 5672),
        ("amqps://app:pw@rabbit/v", "amqps", 5671),
        ("amqp://app:pw@rabbit:5673/v", "amqp", 5673),
        ("amqps://app:pw@rabbit:5674/v", "amqps", 5674),
    ],
)
def test_port_defaults_by_scheme_unless_given(url: str, scheme: str, port: int) -> None:
    settings = BrokerSettings(url)
    assert (settings.scheme, settings.port) == (scheme, port)


def test_host_username_and_password_come_from_the_url() -> None:
    settings = BrokerSettings("amqp://app:pw@rabbit.example:5672/v")
    assert (settings.host, settings.username, settings.password) == ("rabbit.example", "app", "pw")


def test_percent_encoded_credentials_are_decoded() -> None:
    settings = BrokerSettings("amqp://us%40er:p%2Fw%3Ax@rabbit/v")
    assert (settings.username, settings.password) == ("us@er", "p/w:x")


def test_credentials_default_to_guest() -> None:
    settings = BrokerSettings("amqp://rabbit/v")
    assert (settings.username, settings.password) == ("guest", "guest")


def test_ipv6_host_is_unbracketed() -> None:
    settings = BrokerSettings("amqp://app:pw@[::1]:5673/v")
    assert (settings.host, settings.port) == ("::1", 5673)


def test_settings_from_equal_urls_are_equal() -> None:
    assert BrokerSettings("amqp://app:pw@rabbit/v") == BrokerSettings("amqp://app:pw@rabbit/v")


# --- invalid URLs: ConfigurationError without the password --------------------------------------
@pytest.mark.parametrize(
    ("url", "message"),
    [
        pytest.param(
            f"http://app:{SECRET}@rabbit/v",
            "AMQP URL 'http://app:***@rabbit/v' must start with amqp:// or amqps://, not 'http'",
            id="http-scheme",
        ),
        pytest.param(
            f"ftp://app:{SECRET}@rabbit/v",
            "AMQP URL 'ftp://app:***@rabbit/v' must start with amqp:// or amqps://, not 'ftp'",
            id="ftp-scheme",
        ),
        pytest.param(
            f"amqp://app:{SECRET}@/v",
            "AMQP URL 'amqp://app:***@/v' has no host",
            id="no-host",
        ),
        pytest.param(
            f"amqp://app:{SECRET}@rabbit/team/prod",
            "AMQP URL 'amqp://app:***@rabbit/team/prod': the vhost must be one path segment; "
            "write '/' as %2F",
            id="two-path-segments",
        ),
        pytest.param(
            "",
            "EAI_AMQP_URL is empty: expected amqp://user:pass@host:5672/vhost",
            id="empty",
        ),
        pytest.param(
            "   ",
            "EAI_AMQP_URL is empty: expected amqp://user:pass@host:5672/vhost",
            id="blank",
        ),
    ],
)
def test_invalid_url_raises_configuration_error(url: str, message: str) -> None:
    with pytest.raises(ConfigurationError) as excinfo:
        BrokerSettings(url)
    assert str(excinfo.value) == message


@pytest.mark.parametrize(
    "url",
    [
        pytest.param(f"amqp://app:{SECRET}@rabbit:abc/v", id="not-a-number"),
        pytest.param(f"amqp://app:{SECRET}@rabbit:99999/v", id="out-of-range"),
        pytest.param(f"amqp://app:{SECRET}@rabbit:-1/v", id="negative"),
        pytest.param(f"amqps://app:{SECRET}@[::1/v", id="broken-ipv6"),
    ],
)
def test_malformed_url_error_is_masked(url: str) -> None:
    with pytest.raises(ConfigurationError) as excinfo:
        BrokerSettings(url)
    message = str(excinfo.value)
    assert message.startswith("malformed AMQP URL '") and "app:***@" in message
    assert SECRET not in message


@pytest.mark.parametrize(
    "url",
    [
        pytest.param(f"http://app:{SECRET}@rabbit/v", id="bad-scheme"),
        pytest.param(f"amqp://app:{SECRET}@/v", id="no-host"),
        pytest.param(f"amqp://app:{SECRET}@rabbit:abc/v", id="bad-port"),
        pytest.param(f"amqp://app:{SECRET}@rabbit/a/b", id="bad-vhost"),
    ],
)
def test_configuration_error_never_contains_the_password(url: str) -> None:
    with pytest.raises(ConfigurationError) as excinfo:
        BrokerSettings(url)
    assert SECRET not in str(excinfo.value)
    assert SECRET not in repr(excinfo.value)


def test_error_for_password_with_raw_slash_does_not_leak_it() -> None:
    with pytest.raises(ConfigurationError) as excinfo:
        BrokerSettings("amqp://app:Zm9vYmFy/cXV4@rabbit:5672/prod")
    assert "Zm9vYmFy" not in str(excinfo.value)


# --- management API --------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("url", "base"),
    [
        ("amqp://app:pw@rabbit.example:5672/prod", "http://rabbit.example:15672"),
        ("amqps://app:pw@rabbit.example/prod", "http://rabbit.example:15672"),
        ("amqp://app:pw@rabbit.example:5999/%2F", "http://rabbit.example:15672"),
        ("amqp://app:pw@[::1]:5672/v", "http://[::1]:15672"),
    ],
)
def test_management_base_is_derived_from_the_amqp_host(url: str, base: str) -> None:
    assert BrokerSettings(url).management_base == base


@pytest.mark.parametrize(
    ("management_url", "base"),
    [
        ("https://admin:adminpw@mgmt.example:8443/api/", "https://mgmt.example:8443/api"),
        ("http://mgmt.example:15672", "http://mgmt.example:15672"),
        ("http://mgmt.example", "http://mgmt.example"),
        ("http://admin@[::1]:15680/", "http://[::1]:15680"),
    ],
)
def test_management_url_overrides_the_base_without_credentials(
    management_url: str, base: str
) -> None:
    settings = BrokerSettings("amqp://app:pw@rabbit/v", management_url=management_url)
    assert settings.management_base == base


def test_management_credentials_default_to_the_amqp_ones() -> None:
    settings = BrokerSettings("amqp://app:pw@rabbit/v")
    assert settings.management_credentials == ("app", "pw")


def test_management_credentials_come_from_the_management_url() -> None:
    settings = BrokerSettings(
        "amqp://app:pw@rabbit/v", management_url="http://admin:adm%40pw@mgmt:15672"
    )
    assert settings.management_credentials == ("admin", "adm@pw")


def test_management_url_without_credentials_uses_the_amqp_ones() -> None:
    settings = BrokerSettings("amqp://app:pw@rabbit/v", management_url="http://mgmt:15672")
    assert settings.management_credentials == ("app", "pw")


def test_management_url_with_user_only_has_an_empty_password() -> None:
    settings = BrokerSettings("amqp://app:pw@rabbit/v", management_url="http://admin@mgmt:15672")
    assert settings.management_credentials == ("admin", "")


@pytest.mark.parametrize(
    ("management_url", "message"),
    [
        (
            f"ftp://admin:{SECRET}@mgmt:15672",
            "management URL 'ftp://admin:***@mgmt:15672' must look like http://host:15672",
        ),
        ("http://:15672", "management URL 'http://:15672' must look like http://host:15672"),
    ],
)
def test_invalid_management_url_raises_masked_configuration_error(
    management_url: str, message: str
) -> None:
    with pytest.raises(ConfigurationError) as excinfo:
        BrokerSettings("amqp://app:pw@rabbit/v", management_url=management_url)
    assert str(excinfo.value) == message


# --- repr and masking ----------------------------------------------------------------------
def test_repr_masks_the_password() -> None:
    settings = BrokerSettings(f"amqp://app:{SECRET}@rabbit:5672/prod")
    assert (
        repr(settings) == "BrokerSettings(amqp_url='amqp://app:***@rabbit:5672/prod', vhost='prod')"
    )


def test_repr_of_a_container_of_settings_hides_the_password() -> None:
    settings = BrokerSettings(
        f"amqp://app:{SECRET}@rabbit/v", management_url=f"http://admin:{SECRET}@mgmt:15672"
    )
    assert SECRET not in repr([settings]) + str(settings) + f"{settings!r}"


def test_masked_url_property() -> None:
    settings = BrokerSettings(f"amqps://app:{SECRET}@rabbit:5671/%2F")
    assert settings.masked_url == "amqps://app:***@rabbit:5671/%2F"


def test_repr_masks_a_password_with_a_raw_at_sign() -> None:
    settings = BrokerSettings("amqp://app:s3c@r3tpw@rabbit/prod")
    assert settings.password == "s3c@r3tpw"
    assert "r3tpw" not in repr(settings)


@pytest.mark.parametrize(
    ("text", "masked"),
    [
        ("amqp://app:pw@rabbit:5672/v", "amqp://app:***@rabbit:5672/v"),
        ("amqps://app:p:w@rabbit/v", "amqps://app:***@rabbit/v"),
        ("http://admin:pw@mgmt:15672/api", "http://admin:***@mgmt:15672/api"),
        ("amqp://:pw@rabbit/v", "amqp://:***@rabbit/v"),
        ("amqp://app@rabbit/v", "amqp://app@rabbit/v"),
        ("amqp://rabbit:5672/v", "amqp://rabbit:5672/v"),
        (
            "cannot reach amqp://a:x@h1/v nor amqp://b:y@h2/v",
            "cannot reach amqp://a:***@h1/v nor amqp://b:***@h2/v",
        ),
    ],
)
def test_mask_url(text: str, masked: str) -> None:
    assert mask_url(text) == masked


def test_mask_secrets_masks_bare_secrets_and_url_passwords() -> None:
    text = f"login as app/{SECRET} to amqp://app:{SECRET}@rabbit/v refused"
    assert mask_secrets(text, SECRET) == "login as app/*** to amqp://app:***@rabbit/v refused"


def test_mask_secrets_masks_every_secret_given() -> None:
    assert mask_secrets("one two three", "one", "three") == "*** two ***"


def test_mask_secrets_ignores_an_empty_secret() -> None:
    assert mask_secrets("nothing to hide", "") == "nothing to hide"


# --- with_vhost ----------------------------------------------------------------------------
def test_with_vhost_encodes_a_slash_vhost() -> None:
    settings = BrokerSettings("amqp://app:pw@rabbit:5672/prod").with_vhost("/")
    assert (settings.amqp_url, settings.vhost) == ("amqp://app:pw@rabbit:5672/%2F", "/")


def test_with_vhost_round_trips_special_characters() -> None:
    settings = BrokerSettings("amqp://app:pw@rabbit/prod").with_vhost("team/a b")
    assert (settings.amqp_url, settings.vhost) == ("amqp://app:pw@rabbit/team%2Fa%20b", "team/a b")


def test_with_vhost_keeps_broker_credentials_and_options() -> None:
    original = BrokerSettings(
        "amqps://app:pw@rabbit:5671/prod?heartbeat=10",
        management_url="http://admin:adm@mgmt:15672",
        heartbeat=5,
        blocked_connection_timeout=2.5,
        connection_name="worker-1",
    )
    moved = original.with_vhost("test")
    assert moved == BrokerSettings(
        "amqps://app:pw@rabbit:5671/test?heartbeat=10",
        management_url="http://admin:adm@mgmt:15672",
        heartbeat=5,
        blocked_connection_timeout=2.5,
        connection_name="worker-1",
    )


def test_with_vhost_leaves_the_original_unchanged() -> None:
    original = BrokerSettings("amqp://app:pw@rabbit/prod")
    original.with_vhost("other")
    assert original.vhost == "prod"


def test_concurrency_beyond_the_prefetch_is_refused() -> None:
    from amqp_lab.consuming.consumer import ConsumerConfig
    from amqp_lab.errors import ConfigurationError
    from amqp_lab.topology import load_topology

    names = load_topology().names
    assert ConsumerConfig(names, prefetch=8, ack_batch=2, concurrency=4).concurrency == 4
    with pytest.raises(ConfigurationError, match=r"needs a prefetch of at least 9 \(it is 8\)"):
        ConsumerConfig(names, prefetch=8, ack_batch=3, concurrency=3)
