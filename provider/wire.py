"""Checks of untrusted wire input shared by the task and voucher intake.

Pure: signatures parsed, JSON nesting measured before a recursive parser sees the text, and
messages cut short so that error answers stay small.
"""

from __future__ import annotations

import re

from provider.errors import RejectedError

MAX_JSON_DEPTH = 16
"""The deepest JSON nesting a request header or voucher may have (they need 2)."""
_JSON_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"')
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")


def parse_signature(text: str) -> bytes:
    """Parse a 0x-hex 65-byte signature; raise RejectedError(bad_request) otherwise."""
    try:
        raw = bytes.fromhex(text.strip().removeprefix("0x"))
    except ValueError as exc:
        raise RejectedError("bad_request", "signature is not hex") from exc
    if len(raw) != 65:
        raise RejectedError("bad_request", f"signature must be 65 bytes, got {len(raw)}")
    return raw


def json_depth(text: str | bytes) -> int:
    """Return the deepest nesting of arrays and objects in a JSON text, without parsing it.

    Linear and iterative: run before a recursive parser sees the text, it refuses what would
    exhaust the stack (``[`` x 100,000) however high the recursion limit is.
    """
    data = text.encode("utf-8", "replace") if isinstance(text, str) else text
    stripped = _JSON_STRING.sub(b"", data)
    depth = deepest = 0
    for byte in stripped.translate(None, _NOT_BRACKETS):
        if byte in b"[{":
            depth += 1
            deepest = max(deepest, depth)
        else:
            depth -= 1
    return deepest


def shorten(exc: BaseException, most: int = 200) -> str:
    """Return an exception's message cut to ``most`` characters (error answers stay small)."""
    text = str(exc)
    return text if len(text) <= most else text[:most] + "..."


__all__ = ["MAX_JSON_DEPTH", "json_depth", "parse_signature", "shorten"]
