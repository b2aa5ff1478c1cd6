"""One event, one line (pure): text from the broker made safe to put in a text log line.

A message_id, a header or an error message is whatever a publisher sent. Written into a text
line as it is, a newline in it ends the line early and the rest reads as another event: a
message_id of ``x\\nmessage_id=y outcome=processed`` forges a report line. :func:`one_line`
escapes every character that can break a line or control a terminal:

* C0 controls (U+0000..U+001F, tab, newline and carriage return included) and DEL;
* C1 controls (U+0080..U+009F; U+0085 NEL is a line break to Python's ``splitlines``);
* U+2028 LINE SEPARATOR and U+2029 PARAGRAPH SEPARATOR;
* lone surrogates (U+D800..U+DFFF, from ``surrogateescape``), which no UTF-8 log can hold.

They become ``\\n``, ``\\r``, ``\\t`` or ``\\xNN`` / ``\\uNNNN``, as Python writes them.
Backslashes stay as they are, so text with nothing to escape (a Windows path included) comes
back unchanged; the price is that a literal ``\\n`` and an escaped newline look alike. A
reader who needs the exact value takes the tools' ``--json`` output, which is lossless.
"""

from __future__ import annotations

import re

__all__ = ["one_line"]

_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\ud800-\udfff]")
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape(match: re.Match[str]) -> str:
    char = match.group()
    named = _NAMED.get(char)
    if named is not None:
        return named
    code = ord(char)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def one_line(text: str) -> str:
    """``text`` with every line break and control character escaped (see the module doc):
    the result never contains a line break (``len(result.splitlines()) <= 1``), is always
    encodable as UTF-8, and is ``text`` itself when there is nothing to escape."""
    if _UNSAFE.search(text) is None:
        return text
    return _UNSAFE.sub(_escape, text)
