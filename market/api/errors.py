"""Every error the API answers, in one shape (`ErrorPublic`), and each route's statuses declared.

`{"error": <kind>, "detail": <one line>, "problems": [...]}`: `error` names the exception
(`NotFoundError`, `RequestValidationError`, ...), `detail` says what went wrong in one line, and
`problems` lists a 422's bounded validation problems (empty otherwise). A 429 and a 503 also
carry `Retry-After` (whole seconds, at least 1), and a 429's `detail` says the same wait.

No answer carries a secret: every `detail` passes through `services.serving.redact` (node URLs
cut to their host, the RPC URL's key removed), and a 5xx says a stable sentence per kind, never
the text of the exception behind it (that goes to the log, redacted too).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from http import HTTPStatus
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from pydantic import Field as PField
from starlette.exceptions import HTTPException

from market.api.body import BoundedValidationError, bounded_errors
from market.errors import (
    AuthError,
    ChainUnavailableError,
    DuplicateOrderError,
    ForbiddenError,
    InvalidOrderError,
    InvalidRequestError,
    MarketError,
    NotFoundError,
    OrderStateError,
    PayloadTooLargeError,
    RateLimitedError,
    ReplayError,
    SnapshotError,
    UnknownOrderError,
    UnsupportedMediaTypeError,
    WrongClassError,
)
from services.serving import redact

STATUS: tuple[tuple[type[MarketError], int], ...] = (
    (RateLimitedError, 429),
    (PayloadTooLargeError, 413),
    (UnsupportedMediaTypeError, 415),
    (AuthError, 401),
    (ForbiddenError, 403),
    (WrongClassError, 421),
    (ReplayError, 409),
    (DuplicateOrderError, 409),
    (OrderStateError, 409),
    (UnknownOrderError, 404),
    (NotFoundError, 404),
    (InvalidOrderError, 422),
    (InvalidRequestError, 422),
    (SnapshotError, 500),
    (ChainUnavailableError, 503),
)
"""First match wins: subclasses before their bases."""
log = logging.getLogger("market.api")
SERVER_DETAILS: tuple[tuple[type[MarketError], str], ...] = (
    (ChainUnavailableError, "the chain cannot be read now; retry after Retry-After seconds"),
    (SnapshotError, "the market could not read its own state; retry"),
)
"""The `detail` of a 5xx, by kind (the exception's own text goes to the log only)."""
CHAIN_RETRY_AFTER_S = 2
"""`Retry-After` of a 503 from a node that errs (the funds cache's lifetime)."""


class ProblemPublic(BaseModel):
    """One validation problem: where (`loc`), what (`type`, `msg`), the input cut short."""

    type: str
    loc: list[str | int]
    msg: str
    input: Any = None
    ctx: dict[str, str] | None = None


class ErrorPublic(BaseModel):
    """Every error response of the market."""

    error: str = PField(description="the kind of error, e.g. `NotFoundError`")
    detail: str = PField(description="what went wrong, in one line")
    problems: list[ProblemPublic] = PField(description="a 422's validation problems, else []")


def error_response(
    status: int, error: str, detail: str, problems: list[dict[str, Any]] | None = None, **kw: Any
) -> JSONResponse:
    """Return an `ErrorPublic` response."""
    body = {"error": error, "detail": redact(detail), "problems": problems or []}
    if status == 503:
        kw["headers"] = {"Retry-After": str(CHAIN_RETRY_AFTER_S), **(kw.get("headers") or {})}
    return JSONResponse(body, status_code=status, **kw)


UNKNOWN_KIND_STATUS = 500
"""The status of a market error no rule of `STATUS` names: a server error (a kind added where it
is raised and not here is the server's fault, never the caller's), logged."""


def status_of(exc: MarketError) -> int:
    """Return the HTTP status of a market error; a kind no rule names is a 500, logged."""
    for kind, status in STATUS:
        if isinstance(exc, kind):
            return status
    log.error("%s has no HTTP status: answered 500", type(exc).__name__)
    return UNKNOWN_KIND_STATUS


def retry_after_s(exc: RateLimitedError) -> int:
    """Return the whole seconds a rate-limited caller waits: the bucket's wait, at least 1."""
    return max(1, math.ceil(exc.retry_after))


async def market_error_handler(request: Request, exc: Exception) -> JSONResponse:
    """Answer a `MarketError` with its status and its message."""
    assert isinstance(exc, MarketError)
    if isinstance(exc, RateLimitedError):
        wait = retry_after_s(exc)
        return error_response(
            429,
            type(exc).__name__,
            f"rate limit exceeded for {exc.key}; retry after {wait} s",
            headers={"Retry-After": str(wait)},
        )
    status = status_of(exc)
    if status >= 500:
        log.warning("%s: %s", type(exc).__name__, exc)  # redacted by the log handlers
        detail = next((d for kind, d in SERVER_DETAILS if isinstance(exc, kind)), "internal error")
        return error_response(status, type(exc).__name__, detail)
    return error_response(status, type(exc).__name__, str(exc))


async def validation_error_handler(request: Request, exc: Exception) -> JSONResponse:
    """Answer a request that fails validation with 422 and at most `MAX_ERRORS` short problems
    (FastAPI's own answer echoes every problem with its whole input: megabytes for a large body).
    """
    assert isinstance(exc, RequestValidationError)
    if isinstance(exc, BoundedValidationError):
        problems = list(exc.errors())  # bounded by `market.api.body.parse`
    else:
        problems = bounded_errors(exc.errors(), located=())
    first = problems[0] if problems else {"loc": [], "msg": "invalid request"}
    where = ".".join(str(part) for part in first.get("loc", [])) or "request"
    more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
    return error_response(
        422, "RequestValidationError", f"{where}: {first.get('msg', '')}{more}", problems
    )


async def http_error_handler(request: Request, exc: Exception) -> JSONResponse:
    """Answer Starlette's own errors (no such route, method not allowed) in the one shape."""
    assert isinstance(exc, HTTPException)
    phrase = HTTPStatus(exc.status_code).phrase
    kind = "NotFoundError" if exc.status_code == 404 else phrase.title().replace(" ", "") + "Error"
    return error_response(exc.status_code, kind, str(exc.detail), headers=exc.headers)


async def internal_error_handler(request: Request, exc: Exception) -> JSONResponse:
    """Answer an unexpected failure with a 500 in the one shape (the traceback goes to the log)."""
    return error_response(500, "InternalError", "internal error")


def install(app: FastAPI) -> None:
    """Register the handlers on `app` and declare every route's error statuses."""
    app.add_exception_handler(MarketError, market_error_handler)
    app.add_exception_handler(RequestValidationError, validation_error_handler)
    app.add_exception_handler(HTTPException, http_error_handler)
    app.add_exception_handler(Exception, internal_error_handler)
    declare(app)


# -- the statuses each route declares -------------------------------------------------------------

SIGNED = (401, 403, 409, 413, 415, 422, 429)
"""A route taking a signed JSON body: bad signature, not yours, used nonce, size, type, shape."""
ROUTE_ERRORS: dict[tuple[str, str], tuple[int, ...]] = {
    ("post", "/v1/orders"): (*SIGNED, 421, 503),
    ("post", "/v1/orders/batch"): (*SIGNED, 421, 503),
    ("post", "/v1/orders/cancel"): (*SIGNED, 404, 421),
    ("post", "/v1/providers/heartbeat"): (*SIGNED, 421),
    ("post", "/v1/deals/{deal_id}/quote"): (*SIGNED, 404, 503),
    ("get", "/v1/orders/{order_id}"): (404, 413, 422, 429),
    ("get", "/v1/deals/{deal_id}"): (404, 413, 422, 429),
}
"""Statuses beyond the default: every route may answer 413 (the app-wide body cap) and 429 (the
per-IP limit), and 422 when it takes parameters."""
DESCRIPTIONS = {
    401: "Signature invalid, expired or by another signer",
    403: "Not allowed: not the owner, no funds or stake behind it, over a quota",
    404: "No such record",
    409: "Conflicts with what is stored: duplicate, used nonce, wrong state",
    413: "Request body too large",
    415: "Content-Type is not application/json",
    421: "A device class another market process matches: `detail` names this one's classes",
    422: "Invalid request: `problems` lists where",
    429: "Rate limited: retry after `Retry-After` seconds",
    503: "The chain cannot be read now: retry",
}


def declare(app: FastAPI) -> None:
    """Add `ErrorPublic` responses for every status each operation can answer to the schema."""
    generate: Callable[[], dict[str, Any]] = app.openapi

    def openapi() -> dict[str, Any]:
        schema = generate()
        components = schema.setdefault("components", {}).setdefault("schemas", {})
        for model in (ErrorPublic, ProblemPublic):
            definition = model.model_json_schema(ref_template="#/components/schemas/{model}")
            definition.pop("$defs", None)
            components[model.__name__] = definition
        for path, operations in schema.get("paths", {}).items():
            for method, operation in operations.items():
                statuses = ROUTE_ERRORS.get((method, path))
                if statuses is None:
                    takes_input = operation.get("parameters") or operation.get("requestBody")
                    statuses = (413, 422, 429) if takes_input else (413, 429)
                responses = operation.setdefault("responses", {})
                for status in statuses:
                    responses[str(status)] = _response(status)
        for unused in ("HTTPValidationError", "ValidationError"):
            components.pop(unused, None)
        return schema

    app.openapi = openapi  # type: ignore[method-assign]


def _response(status: int) -> dict[str, Any]:
    response: dict[str, Any] = {
        "description": DESCRIPTIONS[status],
        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorPublic"}}},
    }
    if status == 429:
        response["headers"] = {
            "Retry-After": {
                "description": "whole seconds to wait, at least 1",
                "schema": {"type": "integer", "minimum": 1},
            }
        }
    return response
