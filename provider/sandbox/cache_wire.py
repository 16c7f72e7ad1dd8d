"""A task's compile-cache section on the worker's pipe: entries in, new entries out.

The persistent compilation cache is held by the daemon, never by a worker: a worker mounts
no cache directory. With each compile or run request the daemon sends the entries of the
requesting client's own store for that program (``MAGIC``, a JSON header naming the client
tag and each entry's key and length, the entries, then the envelope); the worker's reply
lists the entries it compiled (``cache_put``), appended to its body after the outputs. The
daemon checks their keys and sizes and stores them under the same client only.
"""

from __future__ import annotations

import json
import re
import struct
from dataclasses import dataclass, field

MAGIC = b"TPMCACHE1"
_LEN = struct.Struct(">I")
ENTRY_KEY = re.compile(r"^[A-Za-z0-9_.\-]{1,200}$")
"""What a JAX cache key looks like (a module name, a dash, a hex digest)."""
MAX_HEADER_BYTES = 1 << 20


class CacheWireError(ValueError):
    """A cache section that does not parse."""


@dataclass(slots=True)
class CacheSection:
    """What a request carries for the worker's cache: the tenant and its entries."""

    client: str
    entries: dict[str, bytes] = field(default_factory=dict)
    memory_allowance: int | None = None


def pack_request(section: CacheSection, envelope: bytes) -> bytes:
    """Prefix ``envelope`` with ``section``."""
    names = [[key, len(value)] for key, value in section.entries.items()]
    header = json.dumps(
        {"client": section.client, "entries": names, "memory": section.memory_allowance}
    ).encode()
    return b"".join([MAGIC, _LEN.pack(len(header)), header, *section.entries.values(), envelope])


def unpack_request(payload: bytes) -> tuple[CacheSection | None, bytes]:
    """Split a request payload into its cache section (None: none sent) and the envelope."""
    if not payload.startswith(MAGIC):
        return None, payload
    at = len(MAGIC)
    try:
        (size,) = _LEN.unpack_from(payload, at)
        if size > MAX_HEADER_BYTES:
            raise CacheWireError("cache header too large")
        header = json.loads(payload[at + 4 : at + 4 + size])
        at += 4 + size
        entries: dict[str, bytes] = {}
        for key, length in header["entries"]:
            entries[str(key)] = payload[at : at + int(length)]
            at += int(length)
        memory = header.get("memory")
        return (
            CacheSection(str(header["client"]), entries, None if memory is None else int(memory)),
            payload[at:],
        )
    except (struct.error, ValueError, KeyError, TypeError) as exc:
        raise CacheWireError(f"malformed cache section: {exc}") from exc


def split_reply(
    header: dict[str, object], body: bytes, max_entry_bytes: int
) -> tuple[bytes, dict[str, bytes]]:
    """Split a reply body into the outputs and the entries it lists; drop bad entries.

    A key that is not a JAX cache key, a length out of range or past the body's end drops
    every entry (a worker that answers so is not trusted for any).
    """
    listed = header.pop("cache_put", None)
    if not listed:
        return body, {}
    try:
        pairs = [(str(key), int(length)) for key, length in listed]  # type: ignore[attr-defined]
    except (TypeError, ValueError):
        return body, {}
    total = sum(length for _, length in pairs)
    if total > len(body) or any(
        not ENTRY_KEY.match(key) or not 0 < length <= max_entry_bytes for key, length in pairs
    ):
        return body, {}
    at = len(body) - total
    outputs, entries = body[:at], {}
    for key, length in pairs:
        entries[key] = body[at : at + length]
        at += length
    return outputs, entries


__all__ = [
    "ENTRY_KEY",
    "MAGIC",
    "CacheSection",
    "CacheWireError",
    "pack_request",
    "split_reply",
    "unpack_request",
]
