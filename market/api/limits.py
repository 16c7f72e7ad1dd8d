"""ASGI middleware of the market: the app-wide body size backstop and the security headers.

Each JSON route caps its own body while reading it (`market.api.body`); `BodySizeLimit` refuses
anything larger than the largest cap on any path (Content-Length or streamed), routes without a
body included. `SecurityHeaders` adds to every response what a browser needs to keep the web
order book and the API docs to this origin: a Content-Security-Policy with no external source,
no framing, no MIME sniffing, no referrer (`services.serving.security_headers`, the daemon's
too).
"""

from __future__ import annotations

import json
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from services.serving import MARKET_CSP, security_headers, with_headers

CSP = MARKET_CSP
"""Scripts, styles, images and fetches from this origin only; nothing inline, no frames."""
SECURITY_HEADERS = security_headers(CSP)


class SecurityHeaders:
    """Add `SECURITY_HEADERS` to every HTTP response (keeping any the app set itself)."""

    def __init__(self, app: ASGIApp) -> None:
        """Wrap `app`."""
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Pass the request on; add the headers to the response's start."""
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        await self.app(scope, receive, secured(send))


def secured(send: Send) -> Send:
    """Return ``send`` adding `SECURITY_HEADERS` to a response's start (keeping any the app set
    itself)."""
    return with_headers(send, SECURITY_HEADERS)


class _TooLarge(Exception):
    pass


class BodySizeLimit:
    """Answer 413 to any request whose body exceeds `max_bytes`."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        """Wrap `app`."""
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Reject early on Content-Length, else count bytes as they arrive."""
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        for name, value in scope.get("headers", []):
            if name == b"content-length":
                try:
                    declared = int(value)
                except ValueError:
                    declared = self.max_bytes + 1
                if declared > self.max_bytes:
                    await _reject(send, self.max_bytes)
                    return
        seen = 0
        started = False

        async def counting_receive() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    raise _TooLarge
            return message

        async def tracking_send(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, counting_receive, tracking_send)
        except _TooLarge:
            if not started:
                await _reject(send, self.max_bytes)


async def _reject(send: Send, max_bytes: int) -> None:
    body: dict[str, Any] = {
        "detail": f"request body larger than {max_bytes} bytes",
        "error": "PayloadTooLargeError",
        "problems": [],
    }  # the shape of every error (`market.api.errors.ErrorPublic`)
    raw = json.dumps(body).encode()
    await send(
        {
            "type": "http.response.start",
            "status": 413,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(raw)).encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": raw})
