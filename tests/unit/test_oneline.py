"""Text logs keep one line per event (issue 21, item 4): one_line escapes line breaks and
control characters, and every text line built from broker data goes through it."""

from __future__ import annotations

import logging
import sys
import unicodedata

import pytest
from hypothesis import given
from hypothesis import strategies as st

from amqp_lab.cli.common import run
from amqp_lab.consuming.delivery import DeliveryReport
from amqp_lab.errors import ConfigurationError
from amqp_lab.observability.logs import TextFormatter
from amqp_lab.oneline import one_line
from tests.amqp_values import LINE_BREAKERS, hostile_texts

pytestmark = pytest.mark.unit

FORGED = "m-1\nmessage_id=forged outcome=processed attempts=1 redelivered=false"
any_text = st.text(st.characters(codec=None)) | hostile_texts  # surrogates and controls too


def unsafe(char: str) -> bool:
    return unicodedata.category(char) in ("Cc", "Cs") or char in "\u2028\u2029"


@given(any_text)
def test_the_result_is_one_line_and_utf8(text: str) -> None:
    out = one_line(text)
    assert len(out.splitlines()) <= 1
    assert not any(unsafe(c) for c in out)
    out.encode("utf-8")  # no lone surrogate left


@given(st.text(st.characters(exclude_categories=["Cc", "Cs"])))
def test_text_with_nothing_to_escape_is_unchanged(text: str) -> None:
    text = text.replace("\u2028", "").replace("\u2029", "")
    assert one_line(text) is text


@given(st.text(st.characters(codec=None, exclude_characters="\\")))
def test_without_backslashes_different_texts_stay_different(text: str) -> None:
    assert one_line(text + "\n") != one_line(text + "\r")
    assert one_line(text).count("\\") == sum(unsafe(c) for c in text)


@pytest.mark.parametrize(
    ("text", "escaped"),
    [
        ("a\nb", "a\\nb"),
        ("a\r\nb", "a\\r\\nb"),
        ("\t", "\\t"),
        ("\x00\x1b\x7f", "\\x00\\x1b\\x7f"),
        ("\x85", "\\x85"),
        ("\u2028\u2029", "\\u2028\\u2029"),
        ("\udcff", "\\udcff"),
        ("C:\\dir\\new", "C:\\dir\\new"),  # a backslash stays: nothing to escape
        ("é ü 日本 \u200b", "é ü 日本 \u200b"),
    ],
)
def test_escapes(text: str, escaped: str) -> None:
    assert one_line(text) == escaped


@pytest.mark.parametrize("breaker", LINE_BREAKERS)
def test_a_report_line_cannot_be_forged(breaker: str) -> None:
    report = DeliveryReport(
        f"m-1{breaker}message_id=forged outcome=processed",
        "dead-lettered",
        1,
        False,
        error=f"InvalidMessage: bad{breaker}message_id=x outcome=processed",
    )
    line = report.line()
    assert len(line.splitlines()) == 1 and line.count("outcome=") == 3  # 1 real, 2 escaped
    assert line.startswith("message_id=m-1\\") and " outcome=dead-lettered " in line


def test_a_report_line_is_unchanged_for_plain_ids() -> None:
    line = DeliveryReport("m-1", "processed", 1, False).line()
    assert line == "message_id=m-1 outcome=processed attempts=1 redelivered=false"


def test_text_logs_keep_one_line_per_record() -> None:
    formatter = TextFormatter("%(levelname)s %(name)s: %(message)s")
    record = logging.LogRecord("x", logging.WARNING, __file__, 1, "id=%s", (FORGED,), None)
    assert formatter.format(record) == "WARNING x: id=" + one_line(FORGED)
    try:
        raise ValueError(FORGED)
    except ValueError:
        record.exc_info = sys.exc_info()
    text = formatter.format(record)
    assert len(text.splitlines()) == 1 and "Traceback" in text


def test_a_script_error_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    def main() -> int:
        raise ConfigurationError(f"bad value {FORGED}")

    with pytest.raises(SystemExit) as exit_:
        run(main)
    assert exit_.value.code == 1
    err = capsys.readouterr().err
    assert err == f"error: bad value {one_line(FORGED)}\n"
