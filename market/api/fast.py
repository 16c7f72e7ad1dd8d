"""``POST /v1/orders`` served straight from ASGI: the single-order hot path skips the framework.

Clients post one signed order per request, so this route's per-request cost decides the
market's throughput. `MarketApp` (the market's FastAPI app) hands this one route to
`FastOrders` before any middleware runs, and `FastOrders` does what the route, its
dependencies and the app-wide middleware do, in the same order and with the same answers:

1. the caller's per-IP token (`market.api.deps.limit_ip`);
2. the body read within the route's limits and the app-wide backstop (`market.api.body`,
   `market.api.limits.BodySizeLimit`: JSON content type, declared and streamed size,
   containers and items counted before parsing);
3. the body validated as `OrderCreate` (`market.api.body.parse`, bounded 422s);
4. the order placed (`MarketService.place_async`) and answered 201 with its `PlaceResult`;
5. every answer with the security headers (`market.api.limits.SecurityHeaders`).

Any error goes to the app's own exception handler for its type, so a 4xx here is the byte-for-
byte answer the framework would give. Every other request goes to the framework untouched; the
FastAPI route of the same path stays, for the OpenAPI document and apps built with
``create_app(fast_orders=False)``. The framework's middleware stack (error middleware, body
limit, telemetry, two wrappers of ``send``) cost this route more per request than parsing it.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

from fastapi import FastAPI, Request
from pydantic_core import to_json
from starlette.types import Receive, Scope, Send

from market.api.body import check_shape, order_limits, parse
from market.api.limits import SECURITY_HEADERS, secured
from market.errors import PayloadTooLargeError, UnsupportedMediaTypeError
from market.models import OrderCreate
from market.placement import Placed
from market.service import MarketService
from services.serving import read_streamed_body

PATH = "/v1/orders"
_JSON = (b"content-type", b"application/json")
_HEADERS = (_JSON, *SECURITY_HEADERS)


class MarketApp(FastAPI):
    """The market's FastAPI app, with ``POST /v1/orders`` served by `FastOrders` (if set)
    before the framework's middleware."""

    fast: FastOrders | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Route one ASGI call: the fast route, or the framework."""
        fast = self.fast
        if (
            fast is not None
            and scope["type"] == "http"
            and scope["path"] == PATH
            and scope["method"] == "POST"
        ):
            scope["app"] = self
            await fast(scope, receive, send)
        else:
            await super().__call__(scope, receive, send)


class FastOrders:
    """Serve ``POST /v1/orders`` of ``market`` directly."""

    def __init__(self, market: FastAPI) -> None:
        """Serve the route of ``market`` (whose state and exception handlers it uses)."""
        self.market = market

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Answer one ``POST /v1/orders``."""
        service: MarketService = self.market.state.service
        try:
            client = scope.get("client")
            service.ip_limiter.take(client[0] if client else "unknown")
            headers = _headers(scope)
            _require_json(headers)
            settings = service.settings
            limits = order_limits(settings)
            max_bytes = min(limits.max_bytes, settings.max_body_bytes)  # the backstop's too
            raw = await _read_capped(headers, receive, max_bytes)
            if raw is None:
                return  # the client went away
            check_shape(raw, limits)
            order = parse(OrderCreate, raw)
            [placed] = await service.placed_async([order])
            answer = encode_result(placed)
        except Exception as exc:
            handler = self._handler(exc)
            if handler is None:
                raise
            response = await handler(Request(scope, receive), exc)
            await response(scope, receive, secured(send))
            return
        await send(
            {
                "type": "http.response.start",
                "status": 201,
                "headers": [*_HEADERS, (b"content-length", str(len(answer)).encode())],
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


def encode_result(placed: Placed) -> bytes:
    """Return the JSON of `PlaceResult` for `placed`, byte for byte what
    ``market.presenters.place_results(...)[0].model_dump_json()`` gives (tested), without
    building its models: plain dicts in the models' field order, serialized by pydantic's own
    encoder."""
    c = placed.checked
    o = c.order
    order = {
        "side": o.side.value,
        "owner": o.owner,
        "device_class": o.device_class,
        "quantity": o.quantity,
        "price": o.price,
        "plan": o.plan,
        "slo_ms": o.slo_ms,
        "memory": o.memory,
        "expiry": o.expiry,
        "nonce": c.nonce,
        "order_id": o.order_id,
        "seq": placed.seq,
        "state": placed.state,
        "remaining": placed.remaining,
        "filled": o.quantity - placed.remaining,
        "created_at": float(c.created_at),
        "signature": c.signature,
        "quote": json.loads(c.quote_json) if c.quote_json else None,
        "quote_signature": c.quote_signature,
    }
    fills = [
        {
            "device_class": f.device_class,
            "fill_id": f.fill_id,
            "bid_id": f.bid_id,
            "ask_id": f.ask_id,
            "price": f.price,
            "quantity": f.quantity,
            "aggressor": f.aggressor.value,
            "time": f.time,
            "id": f"{f.device_class}:{f.fill_id}",
        }
        for f in placed.fills
    ]
    return to_json({"order": order, "fills": fills})


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
