"""What both HTTP services (the market, the provider daemon) need to be safe to serve.

- **The recursion limit.** `py_ecc` (imported by eth-account, so by this package) raises
  Python's recursion limit to 100,000 at import; recursion that deep in C code (Python's `json`
  parser, `repr`) overflows the C stack and kills the process instead of raising
  `RecursionError`. Each service's app calls `restore_recursion_limit` when it is built.
- **Connections a slow or idle client cannot hold open.** uvicorn closes a keep-alive
  connection that stays idle after a response, but it arms no timer on a new connection, nor
  while a request arrives: a client that connects and sends nothing, or sends one byte a second,
  keeps its connection (and its slot) forever. `guarded_protocol` returns uvicorn's httptools
  protocol with three more rules:

  - a new connection that sends nothing closes after the keep-alive timeout, like an idle one;
  - a request must arrive whole (request line, headers and body) within `read_timeout` seconds
    of its first byte, plus one second per `min_body_rate` bytes of body received (so a large
    upload at a fair rate is never cut, and a drip is), or the connection closes (with a 408 if
    its headers never completed);
  - its request line and headers may hold at most `max_header_bytes` (a 400 and close beyond).
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

RECURSION_LIMIT = 1_000
"""Python's default, put back after eth-account raised it (see the module's docstring)."""


def restore_recursion_limit() -> None:
    """Undo the recursion limit that importing eth-account raised (see `RECURSION_LIMIT`)."""
    import eth_account  # noqa: F401  # its import raises the limit: make sure that happened

    if sys.getrecursionlimit() > RECURSION_LIMIT:
        sys.setrecursionlimit(RECURSION_LIMIT)


_408 = (
    b"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\n"
    b"connection: close\r\ncontent-length: %d\r\n\r\n%s"
)


class _HeadersTooLarge(Exception):
    """The request line and headers passed the cap (httptools then answers 400 and closes)."""


class GuardedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with a per-request read deadline and a header cap."""

    read_timeout: float = 10.0
    min_body_rate: float = 0.0
    """Bytes of body per extra second of reading (0: the whole request within `read_timeout`)."""
    max_header_bytes: int = 32 << 10
    timeout_body: bytes = b'{"detail":"request not received in time","error":"RequestTimeout"}'

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        """Create the protocol for one connection (uvicorn's arguments)."""
        super().__init__(*args, **kwargs)
        self._read_deadline: asyncio.TimerHandle | None = None
        self._read_started = 0.0
        self._header_bytes = 0
        self._body_bytes = 0

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        """Accept the connection; close it if no request starts within the keep-alive time."""
        super().connection_made(transport)
        self.timeout_keep_alive_task = self.loop.call_later(
            self.timeout_keep_alive, self.timeout_keep_alive_handler
        )

    def connection_lost(self, exc: Exception | None) -> None:
        """Forget the read deadline, then let uvicorn clean up."""
        self._cancel_read_deadline()
        super().connection_lost(exc)

    def on_message_begin(self) -> None:
        """Start a request: it must arrive whole within `read_timeout` seconds (plus its body's
        allowance)."""
        super().on_message_begin()
        self._header_bytes = 0
        self._body_bytes = 0
        self._cancel_read_deadline()
        self._read_started = self.loop.time()
        self._read_deadline = self.loop.call_later(self.read_timeout, self._read_too_slow)

    def on_url(self, url: bytes) -> None:
        """Count the request line against the header cap."""
        self._count_header_bytes(len(url))
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        """Count each header against the header cap."""
        self._count_header_bytes(len(name) + len(value) + 4)
        super().on_header(name, value)

    def on_body(self, body: bytes) -> None:
        """Count the body's bytes: each `min_body_rate` of them buys a second more."""
        self._body_bytes += len(body)
        super().on_body(body)

    def on_message_complete(self) -> None:
        """The whole request arrived: the read deadline is met."""
        self._cancel_read_deadline()
        super().on_message_complete()

    def _count_header_bytes(self, size: int) -> None:
        self._header_bytes += size
        if self._header_bytes > self.max_header_bytes:
            raise _HeadersTooLarge

    def _cancel_read_deadline(self) -> None:
        if self._read_deadline is not None:
            self._read_deadline.cancel()
            self._read_deadline = None

    def _read_too_slow(self) -> None:
        """Close a connection whose request did not arrive in time (or re-arm the deadline if
        the body received since earned more time)."""
        self._read_deadline = None
        if self.min_body_rate > 0:
            allowed = self.read_timeout + self._body_bytes / self.min_body_rate
            left = self._read_started + allowed - self.loop.time()
            if left > 0:
                self._read_deadline = self.loop.call_later(left, self._read_too_slow)
                return
        if self.transport.is_closing():
            return
        idle = self.cycle is None or self.cycle.response_complete  # nothing else being written
        if idle and (self.cycle is None or self.cycle.scope is not self.scope):  # no headers yet
            self.transport.write(_408 % (len(self.timeout_body), self.timeout_body))
        self.transport.close()


def guarded_protocol(
    name: str,
    *,
    read_timeout: float,
    max_header_bytes: int,
    min_body_rate: float = 0.0,
    timeout_body: bytes | None = None,
) -> type[GuardedHttpToolsProtocol]:
    """Return the protocol class (called `name`) with these limits, for `uvicorn.run(http=...)`.

    `timeout_body` is the JSON of the 408 (in the service's own error shape).
    """
    body = timeout_body or (
        b'{"detail":"request not received within %d s","error":"RequestTimeout"}'
        % int(read_timeout)
    )
    return type(
        name,
        (GuardedHttpToolsProtocol,),
        {
            "read_timeout": read_timeout,
            "max_header_bytes": max_header_bytes,
            "min_body_rate": min_body_rate,
            "timeout_body": body,
        },
    )


async def read_streamed_body(
    receive: Callable[[], Awaitable[MutableMapping[str, Any]]],
    max_bytes: int,
    too_large: Callable[[], Exception],
) -> bytes | None:
    """Read an ASGI request body, raising ``too_large()`` as soon as more than ``max_bytes``
    have arrived (nothing past the cap is kept); None if the client disconnected first."""
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > max_bytes:
            raise too_large()
        chunks.append(chunk)
        if not message.get("more_body", False):
            return chunks[0] if len(chunks) == 1 else b"".join(chunks)
