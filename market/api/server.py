"""Serving the app with uvicorn on connections a slow or idle client cannot hold open.

uvicorn closes a keep-alive connection that stays idle after a response, but it arms no timer
on a new connection, nor while a request arrives: a client that connects and sends nothing, or
sends one byte a second, keeps its connection (and its slot) forever. `guarded_protocol` returns
uvicorn's httptools protocol with three more rules:

- a new connection that sends nothing closes after the keep-alive timeout, like an idle one;
- a request must arrive whole (request line, headers and body) within `read_timeout` seconds of
  its first byte, or the connection closes (with a 408 if its headers never completed);
- its request line and headers may hold at most `max_header_bytes` (a 400 and close beyond).

Bodies are capped per route by the app (`market.api.body`), so a request's size and the time
it may take to arrive are both bounded.
"""

from __future__ import annotations

import asyncio
from typing import Any

import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from market.service import Settings

_408 = (
    b"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\n"
    b"connection: close\r\ncontent-length: %d\r\n\r\n%s"
)


class _HeadersTooLarge(Exception):
    """The request line and headers passed the cap (httptools then answers 400 and closes)."""


class GuardedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with a per-request read deadline and a header cap."""

    read_timeout: float = 10.0
    max_header_bytes: int = 32 << 10

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        """Create the protocol for one connection (uvicorn's arguments)."""
        super().__init__(*args, **kwargs)
        self._read_deadline: asyncio.TimerHandle | None = None
        self._header_bytes = 0

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
        """Start a request: it must arrive whole within `read_timeout` seconds."""
        super().on_message_begin()
        self._header_bytes = 0
        self._cancel_read_deadline()
        self._read_deadline = self.loop.call_later(self.read_timeout, self._read_too_slow)

    def on_url(self, url: bytes) -> None:
        """Count the request line against the header cap."""
        self._count_header_bytes(len(url))
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        """Count each header against the header cap."""
        self._count_header_bytes(len(name) + len(value) + 4)
        super().on_header(name, value)

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
        """Close a connection whose request did not arrive in time."""
        self._read_deadline = None
        if self.transport.is_closing():
            return
        idle = self.cycle is None or self.cycle.response_complete  # nothing else being written
        if idle and (self.cycle is None or self.cycle.scope is not self.scope):  # no headers yet
            body = b'{"detail":"request not received within %d s","error":"RequestTimeout"}' % int(
                self.read_timeout
            )
            self.transport.write(_408 % (len(body), body))
        self.transport.close()


def guarded_protocol(settings: Settings) -> type[GuardedHttpToolsProtocol]:
    """Return the protocol class with the read timeout and header cap of `settings`."""
    return type(
        "MarketHttpProtocol",
        (GuardedHttpToolsProtocol,),
        {
            "read_timeout": settings.request_read_timeout_s,
            "max_header_bytes": settings.max_header_bytes,
        },
    )


def serve(app: Any, settings: Settings, *, host: str, port: int, log_level: str) -> None:
    """Run `app` with uvicorn until interrupted, on guarded connections."""
    uvicorn.run(
        app,
        host=host,
        port=port,
        log_level=log_level,
        http=guarded_protocol(settings),
        ws="none",
        timeout_keep_alive=max(1, round(settings.keep_alive_s)),
        limit_concurrency=settings.max_connections,
        timeout_graceful_shutdown=2,
        access_log=False,
    )
