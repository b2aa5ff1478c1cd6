"""Standard JSON (RFC 8259) as the house writes and reads it (pure, no I/O): compact,
deterministic UTF-8 out; in, Python's parser with ``NaN`` and ``Infinity`` refused."""

from __future__ import annotations

import json
import json.scanner
from typing import Any

__all__ = ["decode_json", "encode_json", "parse_json"]


def encode_json(value: Any) -> bytes:
    """Compact, deterministic, standard JSON bytes (UTF-8, RFC 8259). Raises ValueError, one
    line naming the reason, for a value standard JSON cannot carry: NaN or an infinity
    (Python's ``json`` would write ``NaN`` / ``Infinity``, which other parsers refuse) or a
    string with a lone surrogate (not Unicode text, so no UTF-8 form); TypeError for a type
    JSON has no form for."""
    try:
        text = json.dumps(
            value, separators=(",", ":"), sort_keys=True, ensure_ascii=False, allow_nan=False
        )
    except ValueError as e:
        if "Out of range float" not in str(e):
            raise
        raise ValueError("it holds NaN or Infinity: standard JSON has no such number") from e
    try:
        return text.encode()
    except UnicodeEncodeError as e:
        char = e.object[e.start : e.start + 1]
        raise ValueError(
            f"a string holds {char!r}, a lone surrogate: not Unicode text, so no UTF-8 form"
        ) from e


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number (standard JSON has no NaN or Infinity)")


_STRICT_JSON = json.JSONDecoder(parse_constant=_refuse_constant)
# (value, end index) from an index; StopIteration when no value starts there. The decoder is
# the scanner's context, as in JSONDecoder itself (typeshed types the argument otherwise)
_SCAN_JSON = json.scanner.make_scanner(_STRICT_JSON)  # type: ignore[arg-type]


def parse_json(text: str) -> Any:
    """Parse standard JSON text: :func:`decode_json` for a str. Raises ValueError (worded as
    Python's ``json`` words it) or RecursionError. It is ``JSONDecoder.decode`` without its two
    whitespace scans when ``text`` starts and ends with something other than JSON whitespace
    (space, tab, CR, LF: RFC 8259 section 2), as every body our publisher writes does; any
    other text, and any failure, goes through ``decode`` itself: the same value or error."""
    if text and text[0] > " " and text[-1] > " ":
        try:
            value, end = _SCAN_JSON(text, 0)
        except (StopIteration, ValueError):
            pass  # decode below raises the error, worded as it words it
        else:
            if end == len(text):
                return value
    return _STRICT_JSON.decode(text)


def decode_json(text: str | bytes) -> Any:
    """Parse standard JSON (RFC 8259): as ``json.loads``, but ``NaN``, ``Infinity`` and
    ``-Infinity``, which Python's parser accepts, are refused, and bytes are UTF-8 (no
    guessing UTF-16 or UTF-32). Raises ValueError (UnicodeDecodeError for bytes that are not
    UTF-8) or RecursionError (nested too deeply)."""
    if isinstance(text, bytes | bytearray):
        text = bytes(text).decode("utf-8")
    return parse_json(text)
