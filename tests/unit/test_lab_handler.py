"""The lab's task schema: what its handler rejects as a business error (the library imposes
no schema of its own)."""

from __future__ import annotations

import re
from typing import Any

import pytest

from amqp_lab.errors import InvalidMessage
from amqp_lab.message import JSON, Task, decode_body
from lab.handler import lab_body, task_message

pytestmark = pytest.mark.unit


def _task(body: bytes, content_type: str | None = JSON) -> Task:
    return Task("m", decode_body(body, content_type), {}, "tasks", "task", False, 1, content_type)


@pytest.mark.parametrize(
    ("body", "content_type", "reason"),
    [
        (
            b'{"kind":"a"}',
            "text/plain",
            "unsupported content_type 'text/plain', expected application/json",
        ),
        (
            b"[1]",
            "application/jsonx",
            "unsupported content_type 'application/jsonx', expected application/json",
        ),
        (b'[{"kind":"a"}]', JSON, "body must be a JSON object, got list"),
        (b"42", JSON, "body must be a JSON object, got int"),
        (b"4.5", JSON, "body must be a JSON object, got float"),
        (b'"a"', JSON, "body must be a JSON object, got str"),
        (b"null", JSON, "body must be a JSON object, got NoneType"),
        (b"{}", JSON, "body field 'kind' must be a string"),
        (b'{"kind":3}', JSON, "body field 'kind' must be a string"),
        (b'{"kind":null}', JSON, "body field 'kind' must be a string"),
        (b'{"kind":["a"]}', JSON, "body field 'kind' must be a string"),
    ],
)
def test_lab_body_rejects_with_reason(body: bytes, content_type: str, reason: str) -> None:
    with pytest.raises(InvalidMessage, match=f"^{re.escape(reason)}$"):
        lab_body(_task(body, content_type))


def test_lab_body_accepts_a_lab_task() -> None:
    message = task_message("resize", 7, "m-7")
    assert lab_body(_task(message.body, message.content_type)) == {"kind": "resize", "seq": 7}


def test_a_task_body_may_be_anything(capsys: Any) -> None:
    """The same bodies reach a handler of one's own unchanged: the schema is the lab's."""
    assert _task(b"[1]").body == [1]
    assert _task(b"\x00raw", "application/octet-stream").body == b"\x00raw"
