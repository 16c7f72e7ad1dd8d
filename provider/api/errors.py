"""The one place domain errors become HTTP answers: status, body and headers.

Every error answer is ``{"error": code, "reason": text}``. A reason passes through
:func:`services.serving.redact` (node URLs cut to their host, registered secrets removed); a
5xx carries a stable reason per code and never an exception's text; a 503 (and a 429) carries
``Retry-After``.
"""

from __future__ import annotations

import logging
from typing import Final

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from provider.errors import NotFoundError, ProviderError, RejectedError
from services.serving import redact

log = logging.getLogger("provider.api")

STATUS_BY_CODE: Final[dict[str, int]] = {
    "bad_request": 400,
    "task_index_out_of_range": 400,
    "task_index_out_of_order": 400,
    "counterparty_has_code": 400,
    "access_required": 401,
    "insufficient_budget": 402,
    "access_denied": 403,
    "signature_invalid": 403,
    "deal_not_ours": 403,
    "deal_not_found": 404,
    "deal_not_open": 409,
    "deal_expired": 409,
    "deal_closing": 409,
    "window_too_short": 409,
    "unknown_plan": 409,
    "task_index_used": 409,
    "voucher_stale": 409,
    "voucher_not_cumulative": 409,
    "not_delivered": 409,
    "deal_storage_full": 409,
    "outputs_pruned": 410,
    "envelope_too_large": 413,
    "body_too_large": 413,
    "unsupported_media_type": 415,
    "not_found": 404,
    "envelope_malformed": 422,
    "hash_mismatch": 422,
    "target_unsupported": 422,
    "version_unsupported": 422,
    "platform_unsupported": 422,
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
    "chain_busy": 503,
    "deal_not_found_recently": 503,
    "too_many_requests": 429,
    "overloaded": 503,
    "storage_full": 503,
    "provider_error": 500,
    "internal_error": 500,
}

SERVER_REASONS: Final[dict[str, str]] = {
    "chain_unavailable": "the chain cannot be read now: retry after Retry-After seconds",
    "provider_error": "the provider could not serve this request",
    "internal_error": "internal error",
}
"""The reason of a 5xx, by code: never the text of the exception behind it."""
RETRY_AFTER_S: Final = 2
"""``Retry-After`` of a 503 whose cause names no wait (a node that errs: the deal cache's TTL)."""


def error_body(code: str, reason: str) -> dict[str, str]:
    """Return the JSON body of every error answer."""
    return {"error": code, "reason": reason}


UNKNOWN_CODE_STATUS: Final = 500
"""The status of a code `STATUS_BY_CODE` lacks: a server error (a code added where it is raised
and not here is the server's fault, never the caller's), logged."""


def status_of(code: str) -> int:
    """Return the HTTP status of an error code; an unknown code is a 500, logged."""
    status = STATUS_BY_CODE.get(code)
    if status is None:
        log.error("error code %r has no HTTP status: answered 500", code)
        return UNKNOWN_CODE_STATUS
    return status


def render(
    code: str, reason: str, *, retry_after: float | None = None
) -> tuple[int, dict[str, str], dict[str, str]]:
    """Return the status, body and headers of an error answer (see the module docstring)."""
    status = status_of(code)
    headers: dict[str, str] = {}
    if status >= 500 and (code in SERVER_REASONS or status != 503):
        reason = SERVER_REASONS.get(code, SERVER_REASONS["internal_error"])
    if status in (429, 503):
        headers["Retry-After"] = str(max(1, round(retry_after or RETRY_AFTER_S)))
    return status, error_body(code, redact(reason)), headers


def rejected_answer(exc: Exception) -> tuple[int, dict[str, str], dict[str, str]]:
    """Return the answer to an error raised while serving (logging what a 5xx hides)."""
    if isinstance(exc, RejectedError):
        code, reason = exc.code, exc.reason
    elif isinstance(exc, NotFoundError):
        code, reason = "not_found", str(exc)
    elif isinstance(exc, ProviderError):
        code, reason = "provider_error", str(exc)
    else:
        code, reason = "internal_error", "internal error"
    if STATUS_BY_CODE.get(code, UNKNOWN_CODE_STATUS) >= 500:
        log.warning("request failed", extra={"code": code}, exc_info=exc)
    return render(code, reason)


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
    """Map :class:`RejectedError`, :class:`NotFoundError`, other provider errors and any
    unexpected exception through :func:`rejected_answer`."""

    async def failed(_: Request, exc: Exception) -> JSONResponse:
        status, body, headers = rejected_answer(exc)
        return JSONResponse(body, status, headers=headers)

    async def invalid(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError)
        return JSONResponse(error_body("bad_request", redact(validation_reason(exc))), 422)

    app.add_exception_handler(RequestValidationError, invalid)
    for kind in (RejectedError, NotFoundError, ProviderError, Exception):
        app.add_exception_handler(kind, failed)
