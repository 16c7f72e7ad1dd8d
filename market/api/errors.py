"""The one exception handler: every `MarketError` becomes a 4xx with a reason."""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

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
)

STATUS: tuple[tuple[type[MarketError], int], ...] = (
    (RateLimitedError, 429),
    (PayloadTooLargeError, 413),
    (UnsupportedMediaTypeError, 415),
    (AuthError, 401),
    (ForbiddenError, 403),
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


def status_of(exc: MarketError) -> int:
    """Return the HTTP status of a market error (400 if no rule names it)."""
    for kind, status in STATUS:
        if isinstance(exc, kind):
            return status
    return 400


async def market_error_handler(request: Request, exc: Exception) -> JSONResponse:
    """Answer a `MarketError` with its status and `{"detail": reason, "error": type}`."""
    assert isinstance(exc, MarketError)
    headers = {}
    if isinstance(exc, RateLimitedError):
        headers["Retry-After"] = str(max(1, round(exc.retry_after + 0.5)))
    return JSONResponse(
        {"detail": str(exc), "error": type(exc).__name__},
        status_code=status_of(exc),
        headers=headers,
    )


async def validation_error_handler(request: Request, exc: Exception) -> JSONResponse:
    """Answer a request that fails validation with 422 and at most `MAX_ERRORS` short problems
    (FastAPI's own answer echoes every problem with its whole input: megabytes for a large body).
    """
    assert isinstance(exc, RequestValidationError)
    if isinstance(exc, BoundedValidationError):
        detail = list(exc.errors())  # bounded by `market.api.body.parse`
    else:
        detail = bounded_errors(exc.errors(), located=())
    return JSONResponse({"detail": detail}, status_code=422)


def install(app: FastAPI) -> None:
    """Register the handlers on `app`."""
    app.add_exception_handler(MarketError, market_error_handler)
    app.add_exception_handler(RequestValidationError, validation_error_handler)
