"""The DLQ console's pure parts: who may use it, what its pages show, the audit log it shares
with replay.py, and scripts/console.py refusing to listen off loopback without a token."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path

import pytest

from amqp_lab.console.access import (
    TokenLogFilter,
    bearer_token,
    check_binding,
    cookie_value,
    host_is_loopback,
    is_loopback,
    same_secret,
)
from amqp_lab.console.present import (
    MAX_PAYLOAD_CHARS,
    FieldRow,
    age,
    death_rows,
    error_page,
    field_rows,
    payload_text,
    rate_from,
    short_time,
)
from amqp_lab.dlq.audit_log import AuditLog, audit_line
from amqp_lab.dlq.view import DlqEntry
from amqp_lab.errors import (
    AccessRefused,
    AuthenticationFailed,
    BrokerUnavailable,
    ConfigurationError,
    NotFound,
)
from amqp_lab.fieldtable import TaggedBytes, TaggedInt
from tests.support import ROOT

pytestmark = pytest.mark.unit

NOW = datetime(2026, 1, 2, 12, 0, tzinfo=UTC)


def entry(**fields: object) -> DlqEntry:
    values: dict[str, object] = {
        "message_id": "m-1",
        "source": "record",
        "error_type": "RuntimeError",
        "error_message": "boom",
        "classification": "unknown",
        "attempts": 2,
        "first_seen_at": "2026-01-01T10:00:00.000Z",
        "last_failed_at": "2026-01-01T10:05:00.000Z",
        "exchange": "tasks",
        "routing_key": "task",
        "payload": {"n": 1},
        "payload_encoding": "json",
        "headers": {},
    }
    values.update(fields)
    return DlqEntry(**values)  # type: ignore[arg-type]


# --- access --------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.1.2.3", True),
        ("::1", True),
        ("[::1]", True),
        ("localhost", True),
        ("LOCALHOST", True),
        ("0.0.0.0", False),
        ("::", False),
        ("192.168.1.5", False),
        ("example.com", False),
        ("localhost.example.com", False),
        ("", False),
    ],
)
def test_is_loopback(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback


@pytest.mark.parametrize(
    ("header", "loopback"),
    [
        ("localhost", True),
        ("localhost:8085", True),
        ("127.0.0.1:8085", True),
        ("[::1]:8085", True),
        ("evil.example:8085", False),
        ("10.0.0.1:8085", False),
    ],
)
def test_host_is_loopback(header: str, loopback: bool) -> None:
    assert host_is_loopback(header) is loopback


def test_check_binding_needs_a_token_off_loopback() -> None:
    check_binding("127.0.0.1", None)
    check_binding("0.0.0.0", "s3cret")
    with pytest.raises(ConfigurationError, match=r"refusing to listen on 0\.0\.0\.0"):
        check_binding("0.0.0.0", None)
    with pytest.raises(ConfigurationError):
        check_binding("10.1.2.3", "")


def test_secrets_and_bearer_tokens() -> None:
    assert same_secret("abc", "abc")
    assert not same_secret("abd", "abc")
    assert not same_secret(None, "abc")
    assert not same_secret("", "abc")
    assert bearer_token("Bearer abc") == "abc"
    assert bearer_token("bearer  abc ") == "abc"
    assert bearer_token("Basic abc") is None
    assert bearer_token("Bearer") is None
    assert bearer_token(None) is None
    assert cookie_value("abc") == cookie_value("abc") != cookie_value("abd")
    assert "abc" not in cookie_value("abc")


def test_the_token_is_masked_in_logs() -> None:
    record = logging.LogRecord(
        "werkzeug", logging.INFO, __file__, 1, '"GET /?token=%s HTTP/1.1" 302', ("s3cret",), None
    )
    assert TokenLogFilter("s3cret").filter(record)
    assert record.getMessage() == '"GET /?token=*** HTTP/1.1" 302'
    other = logging.LogRecord("x", logging.INFO, __file__, 1, "token s3cret used", None, None)
    TokenLogFilter("s3cret").filter(other)
    assert other.getMessage() == "token *** used"


# --- present -------------------------------------------------------------------------------
def test_field_rows_show_each_values_amqp_type() -> None:
    rows = field_rows(
        {
            "s": "text",
            "small": TaggedInt(5, "b"),
            "n": 7,
            "price": Decimal("1.50"),
            "ok": True,
            "raw": b"\x00\x01",
            "latin": TaggedBytes(b"\xe9"),
            "at": datetime(2026, 1, 1, tzinfo=UTC),
            "nested": {"a": [1, "x"]},
            "none": None,
        }
    )
    assert rows == [
        FieldRow("s", "S", "long string", "text"),
        FieldRow("small", "b", "signed 8-bit", "5"),
        FieldRow("n", "I", "signed 32-bit", "7"),
        FieldRow("price", "D", "decimal", "1.50"),
        FieldRow("ok", "t", "boolean", "true"),
        FieldRow("raw", "x", "byte array", "AAE= (base64)"),
        FieldRow("latin", "Sb", "long string, not UTF-8", "6Q== (base64)"),
        FieldRow("at", "T", "timestamp", "1767225600 (2026-01-01T00:00:00.000Z)"),
        FieldRow("nested", "F", "table", '[["a", {"A": [{"I": 1}, {"S": "x"}]}]]'),
        FieldRow("none", "V", "void", "null"),
    ]


def test_field_rows_of_an_unencodable_value_is_one_row() -> None:
    (row,) = field_rows({"bad": object()})
    assert row.tag == "?"


def test_payload_text() -> None:
    assert payload_text(entry(payload={"a": [1, "é"]})) == (
        '{\n  "a": [\n    1,\n    "é"\n  ]\n}',
        "JSON",
    )
    assert payload_text(entry(payload="<b>x</b>", payload_encoding="text")) == ("<b>x</b>", "text")
    text, note = payload_text(entry(payload="AAEC", payload_encoding="base64"))
    assert (text, note) == ("AAEC", "binary, 3 bytes, shown as base64")
    long_text, long_note = payload_text(
        entry(payload="x" * (MAX_PAYLOAD_CHARS + 5), payload_encoding="text")
    )
    assert len(long_text) == MAX_PAYLOAD_CHARS and "first 100,000 of 100,005" in long_note


def test_death_rows() -> None:
    deaths = [{"reason": b"expired", "count": 2, "routing-keys": [b"a", "b"], "time": NOW}]
    assert death_rows(deaths) == [
        [
            ("reason", "expired"),
            ("count", "2"),
            ("routing-keys", "a, b"),
            ("time", "2026-01-02T12:00:00+00:00"),
        ]
    ]
    assert death_rows(None) == []


def test_times() -> None:
    assert short_time("2026-01-01T10:05:00.123Z") == "2026-01-01 10:05:00 UTC"
    assert short_time(None) == "-"
    assert short_time("not a time") == "not a time"
    assert age("2026-01-02T11:59:30.000Z", NOW) == "30 s"
    assert age("2026-01-02T11:00:00.000Z", NOW) == "1 h"
    assert age("2025-12-30T12:00:00.000Z", NOW) == "3 d"
    assert age(None, NOW) == age("garbage", NOW) == ""


def test_error_pages_say_what_happened_without_a_password() -> None:
    where = {"queue": "q:tasks:dlq", "vhost": "v1"}
    missing = error_page(NotFound("404 NOT_FOUND - no queue 'q:tasks:dlq'", 404), **where)
    assert missing.status == 404 and "q:tasks:dlq" in missing.message
    down = error_page(BrokerUnavailable("cannot connect at amqp://u:s3cret@h:1/v1"), **where)
    assert down.status == 503 and "s3cret" not in down.message and "***" in down.message
    assert error_page(AuthenticationFailed("no"), **where).status == 502
    assert error_page(AccessRefused("403 ACCESS_REFUSED", 403), **where).status == 502
    assert error_page(ConfigurationError("audit log"), **where).status == 500


def test_rate_from() -> None:
    assert rate_from("") is None
    assert rate_from(None) is None
    assert rate_from("2.5") == 2.5
    for bad in ("0", "-1", "nan", "inf", "abc", "1e9"):
        with pytest.raises(ValueError):
            rate_from(bad)


# --- the audit log -------------------------------------------------------------------------
def test_audit_lines_keep_replay_pys_format(tmp_path: Path) -> None:
    path = tmp_path / "deep" / "audit.jsonl"
    with AuditLog(path, vhost="v1", queue="q:tasks:dlq", clock=lambda: 0.5) as log:
        log.write(entry(), "replayed")
        log.write(entry(message_id="m-2", attempts=None), "deleted", "by the console")
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert lines[0] == audit_line(entry(), "replayed", "", vhost="v1", queue="q:tasks:dlq", at=0.5)
    assert list(lines[0]) == [
        "at",
        "vhost",
        "queue",
        "message_id",
        "status",
        "error_type",
        "record_last_failed_at",
        "record_attempts",
        "detail",
    ]
    assert lines[0]["at"] == "1970-01-01T00:00:00.500Z"
    assert (lines[1]["message_id"], lines[1]["status"], lines[1]["record_attempts"]) == (
        "m-2",
        "deleted",
        None,
    )


# --- scripts/console.py --------------------------------------------------------------------
@pytest.mark.timeout(60)
def test_the_console_refuses_to_listen_off_loopback_without_a_token() -> None:
    env = {k: v for k, v in os.environ.items() if k != "EAI_CONSOLE_TOKEN"}
    env["EAI_AMQP_URL"] = "amqp://u:s3cret@127.0.0.1:1/v1"
    result = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "console.py"), "--host", "0.0.0.0"],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 1
    assert "Traceback" not in result.stderr and "s3cret" not in result.stderr
    (line,) = result.stderr.splitlines()
    assert line.startswith("error: refusing to listen on 0.0.0.0 without an access token")
    assert result.stdout == ""
