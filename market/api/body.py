"""Request bodies that cannot crash or stall the market, with their schema kept published.

Every JSON route reads its body through `JsonBody`, never through FastAPI's own parsing (which
decodes with Python's `json`, whose C parser recurses once per nesting level: with the recursion
limit a dependency raises at import, `[` x 100,000 overflows the C stack). In order:

1. **Content-Type** must be `application/json` (415 otherwise), before a byte is read.
2. **Size**: a declared `Content-Length` over the route's cap is refused at once, and the body is
   read as a stream and refused (413) as soon as it passes the cap, so no route ever buffers more
   than its cap (`BodySizeLimit` in `market.api.limits` is the app-wide backstop).
3. **Shape before parsing**: the bytes are counted (C speed) for containers (`{`, `[`) and items
   (`,`) against the route's limits (413): a 1 MiB batch of 60,000 tiny orders is refused before
   any of it is decoded. Strings inside the JSON only make the counts larger, never smaller.
4. **Parse and validate in one step** with pydantic (`model_validate_json`: a Rust parser that
   refuses nesting deeper than 200 levels with a `json_invalid` error, recursing on no C stack),
   in a worker thread when the body is large, so the event loop keeps serving.
5. **Bounded errors**: a 422 lists at most `MAX_ERRORS` problems, each input cut to
   `MAX_INPUT_CHARS`, and says how many there were in all.

`json_body` and `publish_schemas` keep each request body in the OpenAPI document, so clients and
schema-driven tests see what FastAPI would have published.
"""

from __future__ import annotations

import asyncio
import reprlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ValidationError

from market.errors import PayloadTooLargeError, UnsupportedMediaTypeError
from market.settings import Settings

M = TypeVar("M", bound=BaseModel)
_REF = "#/components/schemas/{model}"

INLINE_PARSE_BYTES = 32 << 10
"""Larger bodies are validated in a worker thread: a 500-order batch of invalid orders takes
tens of milliseconds to validate, which the event loop must not spend."""
MAX_ERRORS = 10
"""Problems a 422 lists (the total is given too)."""
MAX_INPUT_CHARS = 120
"""Characters of an offending input echoed back in a 422."""
_REPR = reprlib.Repr()
_REPR.maxlevel, _REPR.maxdict, _REPR.maxlist = 2, 4, 4
_REPR.maxstring = _REPR.maxother = _REPR.maxlong = 60
"""Shows a large input's beginning without walking all of it."""


@dataclass(frozen=True)
class BodyLimits:
    """What one route accepts: bytes, containers (`{`, `[`) and items (`,` + 1)."""

    max_bytes: int
    max_containers: int
    max_items: int


def order_limits(settings: Settings) -> BodyLimits:
    """Limits of `POST /v1/orders`: one order (an ask carries its quote and plan)."""
    return BodyLimits(settings.max_order_bytes, 8, 64)


def batch_limits(settings: Settings) -> BodyLimits:
    """Limits of `POST /v1/orders/batch`: `max_batch` orders of at most 3 objects and 40 fields
    each (an ask: the order, its quote, the quote's plan)."""
    orders = settings.max_batch
    return BodyLimits(settings.max_body_bytes, 3 * orders + 2, 40 * orders + 2)


def small_limits(settings: Settings) -> BodyLimits:
    """Limits of a cancel or a quote attach: a few small objects."""
    return BodyLimits(settings.max_small_body_bytes, 8, 64)


def heartbeat_limits(settings: Settings) -> BodyLimits:
    """Limits of `POST /v1/providers/heartbeat`: the advert may carry extra keys, but few."""
    return BodyLimits(settings.max_heartbeat_bytes, 64, 512)


class Parsed(Generic[M]):
    """A validated body and the bytes it came from (the heartbeat hashes its advert as sent)."""

    __slots__ = ("model", "raw")

    def __init__(self, model: M, raw: bytes) -> None:
        """Hold `model`, validated from `raw`."""
        self.model = model
        self.raw = raw


class JsonBody(Generic[M]):
    """A dependency that reads and validates a route's JSON body within the route's limits."""

    def __init__(self, model: type[M], limits: Callable[[Settings], BodyLimits]) -> None:
        """Validate bodies as `model` within `limits(settings)` of the running market."""
        self.model = model
        self.limits = limits

    async def __call__(self, request: Request) -> Parsed[M]:
        """Return the parsed body, or raise a 413, 415 or 422 with a short reason."""
        settings: Settings = request.app.state.service.settings
        limits = self.limits(settings)
        require_json(request)
        raw = await read_capped(request, limits.max_bytes)
        check_shape(raw, limits)
        if len(raw) <= INLINE_PARSE_BYTES:
            return Parsed(parse(self.model, raw), raw)
        return Parsed(await asyncio.to_thread(parse, self.model, raw), raw)


def require_json(request: Request) -> None:
    """Raise `UnsupportedMediaTypeError` unless the body is declared `application/json`."""
    declared = request.headers.get("content-type", "")
    media = declared.split(";", 1)[0].strip().lower()
    if media != "application/json":
        shown = declared[:60] or "none"
        raise UnsupportedMediaTypeError(f"content type {shown!r}: send application/json")


async def read_capped(request: Request, max_bytes: int) -> bytes:
    """Return the body, refusing (413) a declared or streamed size above `max_bytes` as soon as
    it is known: never buffer more than the cap."""
    declared = request.headers.get("content-length")
    if declared is not None:
        if not declared.isdigit() or len(declared) > 12:
            raise PayloadTooLargeError(f"bad content-length {declared[:20]!r}")
        if int(declared) > max_bytes:
            raise PayloadTooLargeError(f"request body larger than {max_bytes} bytes")
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > max_bytes:
            raise PayloadTooLargeError(f"request body larger than {max_bytes} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


def check_shape(raw: bytes, limits: BodyLimits) -> None:
    """Raise `PayloadTooLargeError` if `raw` may hold more containers or items than allowed.

    Counts bytes, not tokens: a `{`, `[` or `,` inside a string counts too, so the counts bound
    the real ones from above (the market's fields never hold those characters).
    """
    containers = raw.count(b"{") + raw.count(b"[")
    if containers > limits.max_containers:
        raise PayloadTooLargeError(
            f"request body has {containers} objects or arrays; at most {limits.max_containers}"
        )
    items = raw.count(b",") + 1
    if items > limits.max_items:
        raise PayloadTooLargeError(f"request body has {items} items; at most {limits.max_items}")


class BoundedValidationError(RequestValidationError):
    """A 422 whose errors are already bounded (`bounded_errors`)."""


def parse(model: type[M], body: bytes) -> M:
    """Validate a JSON body against `model`; raise `RequestValidationError` (422) if it fails."""
    try:
        return model.model_validate_json(body)
    except ValidationError as exc:
        raise BoundedValidationError(bounded_errors(exc.errors(include_url=False))) from None


def bounded_errors(errors: Any, located: tuple[str, ...] = ("body",)) -> list[dict[str, Any]]:
    """Return the first `MAX_ERRORS` validation errors, located in the body, inputs shortened,
    and, if there were more, one last entry saying how many."""
    shown = [_short(error, located) for error in list(errors)[:MAX_ERRORS]]
    hidden = len(errors) - len(shown)
    if hidden > 0:
        shown.append(
            {"type": "too_many_errors", "loc": list(located), "msg": f"and {hidden} more errors"}
        )
    return shown


def _short(error: Any, located: tuple[str, ...]) -> dict[str, Any]:
    """Return one pydantic error with its input and context printable and short."""
    short: dict[str, Any] = {
        "type": error.get("type"),
        "loc": [*located, *error.get("loc", ())],
        "msg": _cut(str(error.get("msg", ""))),
    }
    if "input" in error:
        short["input"] = _short_input(error["input"])
    if error.get("ctx"):
        short["ctx"] = {str(k)[:40]: _cut(str(v)) for k, v in list(error["ctx"].items())[:4]}
    return short


def _short_input(value: Any) -> Any:
    """Return an input as JSON can carry it, short: integers and booleans as they are (if
    short), anything else as a string of at most `MAX_INPUT_CHARS` (a float may be infinite)."""
    if isinstance(value, bool | int) and len(str(value)) <= MAX_INPUT_CHARS:
        return value
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    return _cut(value if isinstance(value, str) else _REPR.repr(value))


def _cut(text: str) -> str:
    return text if len(text) <= MAX_INPUT_CHARS else text[: MAX_INPUT_CHARS - 3] + "..."


def json_body(model: type[BaseModel]) -> dict[str, Any]:
    """Return the `openapi_extra` that documents a route's JSON body as `model`."""
    schema = {"$ref": _REF.format(model=model.__name__)}
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": schema}}}}


def publish_schemas(app: FastAPI, *models: type[BaseModel]) -> None:
    """Add `models` (and the models they use) to the app's OpenAPI components."""
    generate: Callable[[], dict[str, Any]] = app.openapi

    def openapi() -> dict[str, Any]:
        schema = generate()
        components = schema.setdefault("components", {}).setdefault("schemas", {})
        for model in models:
            if model.__name__ not in components:
                definition = model.model_json_schema(ref_template=_REF)
                for name, sub in definition.pop("$defs", {}).items():
                    components.setdefault(name, sub)
                components[model.__name__] = definition
        return schema

    app.openapi = openapi  # type: ignore[method-assign]
