"""``POST /v1/orders`` served straight from ASGI: the single-order hot path skips the framework.

Clients post one signed order per request, so this route's per-request cost decides the
market's throughput. `FastOrders` sits in front of the FastAPI app (inside the app-wide
middleware: body size backstop, security headers) and serves this one route itself, doing what
the route and its dependencies do, in the same order and with the same answers:

1. the caller's per-IP token (`market.api.deps.limit_ip`);
2. the body read within the route's limits (`market.api.body`: JSON content type, declared and
   streamed size, containers and items counted before parsing);
3. the body validated as `OrderCreate` (`market.api.body.parse`, bounded 422s);
4. the order placed (`MarketService.place_async`) and answered 201 with its `PlaceResult`.

Any error goes to the app's own exception handler for its type, so a 4xx here is the byte-for-
byte answer the framework would give. Every other request goes to the app untouched; the
FastAPI route of the same path stays, for the OpenAPI document and apps served without this
wrapper.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from fastapi import FastAPI, Request
from starlette.types import ASGIApp, Receive, Scope, Send

from contracts.serving import read_streamed_body
from market.api.body import check_shape, order_limits, parse
from market.errors import PayloadTooLargeError, UnsupportedMediaTypeError
from market.models import OrderCreate
from market.service import MarketService

PATH = "/v1/orders"
_JSON = (b"content-type", b"application/json")


class FastOrders:
    """Serve ``POST /v1/orders`` directly; hand every other request to ``app``."""

    def __init__(self, app: ASGIApp, market: FastAPI) -> None:
        """Wrap ``app``, the inner ASGI stack of ``market`` (whose state and exception handlers
        this route uses)."""
        self.app = app
        self.market = market

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Route one ASGI call."""
        if scope["type"] == "http" and scope["method"] == "POST" and scope["path"] == PATH:
            await self._place(scope, receive, send)
        else:
            await self.app(scope, receive, send)

    async def _place(self, scope: Scope, receive: Receive, send: Send) -> None:
        service: MarketService = self.market.state.service
        try:
            client = scope.get("client")
            service.ip_limiter.take(client[0] if client else "unknown")
            headers = _headers(scope)
            _require_json(headers)
            limits = order_limits(service.settings)
            raw = await _read_capped(headers, receive, limits.max_bytes)
            if raw is None:
                return  # the client went away
            check_shape(raw, limits)
            order = parse(OrderCreate, raw)
            [result] = await service.place_async([order])
            answer = result.model_dump_json().encode()
        except Exception as exc:
            handler = self._handler(exc)
            if handler is None:
                raise
            response = await handler(Request(scope, receive), exc)
            await response(scope, receive, send)
            return
        await send(
            {
                "type": "http.response.start",
                "status": 201,
                "headers": [_JSON, (b"content-length", str(len(answer)).encode())],
            }
        )
        await send({"type": "http.response.body", "body": answer})

    def _handler(self, exc: Exception) -> Callable[[Request, Exception], Any] | None:
        """Return the app's exception handler for ``exc`` (nearest class first), if any."""
        handlers: Mapping[Any, Callable[[Request, Exception], Any]] = self.market.exception_handlers
        for kind in type(exc).__mro__:
            if kind in handlers:
                return handlers[kind]
        return None


def _headers(scope: Scope) -> dict[bytes, bytes]:
    """Return the two request headers this route reads (lowercase names, as ASGI sends them)."""
    found: dict[bytes, bytes] = {}
    for name, value in scope["headers"]:
        if name == b"content-type" or name == b"content-length":
            found.setdefault(name, value)
    return found


def _require_json(headers: Mapping[bytes, bytes]) -> None:
    """Raise `UnsupportedMediaTypeError` unless the body is declared `application/json` (as
    `market.api.body.require_json`)."""
    declared = headers.get(b"content-type", b"").decode("latin-1")
    if declared.split(";", 1)[0].strip().lower() != "application/json":
        shown = declared[:60] or "none"
        raise UnsupportedMediaTypeError(f"content type {shown!r}: send application/json")


async def _read_capped(
    headers: Mapping[bytes, bytes], receive: Receive, max_bytes: int
) -> bytes | None:
    """Return the body, refusing (413) a declared or streamed size above ``max_bytes`` as soon
    as it is known (as `market.api.body.read_capped`); None if the client disconnected."""
    declared = headers.get(b"content-length")
    if declared is not None:
        text = declared.decode("latin-1")
        if not text.isdigit() or len(text) > 12:
            raise PayloadTooLargeError(f"bad content-length {text[:20]!r}")
        if int(text) > max_bytes:
            raise PayloadTooLargeError(f"request body larger than {max_bytes} bytes")
    return await read_streamed_body(
        receive,
        max_bytes,
        lambda: PayloadTooLargeError(f"request body larger than {max_bytes} bytes"),
    )
