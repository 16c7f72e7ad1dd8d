"""The one place domain errors become HTTP statuses."""

from __future__ import annotations

from typing import Final

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from provider.errors import NotFoundError, ProviderError, RejectedError

STATUS_BY_CODE: Final[dict[str, int]] = {
    "bad_request": 400,
    "access_required": 401,
    "insufficient_budget": 402,
    "access_denied": 403,
    "signature_invalid": 403,
    "deal_not_ours": 403,
    "deal_not_found": 404,
    "deal_not_open": 409,
    "deal_expired": 409,
    "window_too_short": 409,
    "unknown_plan": 409,
    "task_index_used": 409,
    "voucher_stale": 409,
    "voucher_not_cumulative": 409,
    "not_delivered": 409,
    "envelope_too_large": 413,
    "body_too_large": 413,
    "unsupported_media_type": 415,
    "envelope_malformed": 422,
    "hash_mismatch": 422,
    "target_unsupported": 422,
    "price_above_max": 422,
    "deadline_too_soon": 422,
    "deadline_after_expiry": 422,
    "voucher_covers_undelivered": 422,
    "voucher_covers_claimed": 422,
    "voucher_covers_refunded": 422,
    "voucher_underpays": 422,
    "voucher_over_cap": 422,
    "voucher_leaves_cap_short": 422,
    "chain_unavailable": 503,
}


def error_body(code: str, reason: str) -> dict[str, str]:
    """Return the JSON body of every error answer."""
    return {"error": code, "reason": reason}


MAX_REASON_CHARS = 600
"""Error answers never echo what was sent: a validation reason names fields, cut to this."""


def validation_reason(exc: RequestValidationError) -> str:
    """Return where and why a request failed validation, without the input it carried."""
    parts = []
    for error in exc.errors()[:5]:
        where = ".".join(str(part) for part in error.get("loc", ()))
        parts.append(f"{where}: {str(error.get('msg', 'invalid'))[:100]}")
    text = "; ".join(parts)
    return text if len(text) <= MAX_REASON_CHARS else text[:MAX_REASON_CHARS] + "..."


def install(app: FastAPI) -> None:
    """Map :class:`RejectedError`, :class:`NotFoundError` and other provider errors."""

    async def rejected(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RejectedError)
        return JSONResponse(error_body(exc.code, exc.reason), STATUS_BY_CODE.get(exc.code, 400))

    async def not_found(_: Request, exc: Exception) -> JSONResponse:
        return JSONResponse(error_body("not_found", str(exc)), 404)

    async def provider_error(_: Request, exc: Exception) -> JSONResponse:
        return JSONResponse(error_body("provider_error", str(exc)), 500)

    async def invalid(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError)
        return JSONResponse(error_body("bad_request", validation_reason(exc)), 422)

    app.add_exception_handler(RequestValidationError, invalid)
    app.add_exception_handler(RejectedError, rejected)
    app.add_exception_handler(NotFoundError, not_found)
    app.add_exception_handler(ProviderError, provider_error)
