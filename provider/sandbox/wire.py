"""Framing of messages between the sandbox parent and its workers.

One frame = u32 header length | UTF-8 JSON header | raw payload. JSON rather than pickle in
both directions, so a worker compromised by a blob cannot make the parent unpickle anything.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Mapping
from typing import Any

_LEN = struct.Struct(">I")

Header = dict[str, Any]


class FrameError(ValueError):
    """Raised on a frame that cannot be decoded."""


def pack(header: Mapping[str, object], payload: bytes = b"") -> bytes:
    """Build one frame."""
    encoded = json.dumps(header, separators=(",", ":")).encode()
    return b"".join((_LEN.pack(len(encoded)), encoded, payload))


def unpack(frame: bytes) -> tuple[Header, bytes]:
    """Split a frame into its header and payload."""
    if len(frame) < _LEN.size:
        raise FrameError("short frame")
    (length,) = _LEN.unpack_from(frame)
    end = _LEN.size + length
    if end > len(frame):
        raise FrameError("header length beyond frame")
    try:
        header = json.loads(frame[_LEN.size : end])
    except ValueError as exc:
        raise FrameError(f"bad frame header: {exc}") from exc
    if not isinstance(header, dict):
        raise FrameError("frame header is not an object")
    return header, frame[end:]
