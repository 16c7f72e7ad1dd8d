"""``POST /v1/tasks`` served straight from ASGI: the task hot path skips the framework.

The FastAPI route of the same path declares the schema (OpenAPI) and runs the same code
(:func:`submit_answer`) when the app is served without this wrapper; through :class:`FastTasks`
(:func:`provider.api.create_app`) the framework's middleware stack, routing and exception
handlers stay off the hot path.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from math import ceil
from urllib.parse import parse_qs

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from programs.envelope import ProgramFormatError, check_target_name
from provider.api.errors import rejected_answer, render
from provider.api.models import (
    REQUEST_HEADER,
    SIGNATURE_HEADER,
    TARGET_HEADER,
    ack_only_json,
    task_json,
)
from provider.api.waiting import settled_view
from provider.daemon import Daemon
from provider.errors import RejectedError
from provider.task_checks import CheckedRequest
from provider.uploads import admit_upload
from provider.wire import MAX_JSON_DEPTH, json_depth
from services.fairness import RequestBudget
from services.serving import API_CSP, read_streamed_body, security_headers, with_headers

MAX_WAIT_S = 60.0
SECURITY_HEADERS = security_headers(API_CSP)
"""On every answer: nothing of it may load, run or be framed in a browser, nor be sniffed."""
MAX_SMALL_BODY_BYTES = 64 * 1024
"""The body cap of every route but ``POST /v1/tasks`` (a voucher of 256 bitmap words fits)."""
_JSON = (b"content-type", b"application/json")
_ENVELOPE_TYPES = frozenset({"", "application/octet-stream"})
_BODY_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})


def parse_wait(text: str | None) -> float:
    """Return the ``wait`` query value in seconds (0..60); raise RejectedError otherwise."""
    if text is None or text == "":
        return 0.0
    try:
        wait = float(text)
    except ValueError as exc:
        raise RejectedError("bad_request", f"wait must be a number, got {text!r}") from exc
    if not 0 <= wait <= MAX_WAIT_S:
        raise RejectedError("bad_request", f"wait must be within 0..{MAX_WAIT_S:g} seconds")
    return wait


def check_length(daemon: Daemon, headers: Mapping[str, str]) -> None:
    """Refuse a body whose declared length is above the envelope cap, before reading it."""
    _check_declared(headers, daemon.config.max_envelope_bytes, "envelope_too_large")


def _check_declared(headers: Mapping[str, str], cap: int, code: str) -> None:
    length = headers.get("content-length")
    if length is None:
        return
    if not length.strip().isdigit():
        raise RejectedError("bad_request", "Content-Length is not a number")
    if len(length.strip()) > 20 or int(length) > cap:
        raise RejectedError(code, f"{length[:24]} bytes, cap {cap}")


def media_type(headers: Mapping[str, str]) -> str:
    """Return a request's media type, lowercase, without parameters ("" when none is sent)."""
    return headers.get("content-type", "").split(";", 1)[0].strip().lower()


def check_envelope_type(headers: Mapping[str, str]) -> None:
    """Refuse a task body sent as anything but raw bytes (``application/octet-stream``)."""
    if media_type(headers) not in _ENVELOPE_TYPES:
        raise RejectedError(
            "unsupported_media_type", "the task body is the raw envelope: application/octet-stream"
        )


def check_headers(daemon: Daemon, headers: Mapping[str, str]) -> CheckedRequest:
    """Check the signed request of a task submission (and the form of its compile target)
    before its body is read.

    On the event loop, await :func:`load_deal` first: this reads the deal from the cache.
    """
    task_request = headers.get(REQUEST_HEADER.lower())
    signature = headers.get(SIGNATURE_HEADER.lower())
    if task_request is None or signature is None:
        raise RejectedError("bad_request", f"{REQUEST_HEADER} and {SIGNATURE_HEADER} are required")
    target = headers.get(TARGET_HEADER.lower())
    if target is not None:
        try:
            check_target_name(target)
        except ProgramFormatError as exc:
            raise RejectedError("bad_request", f"{TARGET_HEADER}: {exc}"[:200]) from None
    return daemon.service.check_request(task_request, signature)


async def load_deal(daemon: Daemon, headers: Mapping[str, str]) -> None:
    """Bring a task submission's deal into the deal cache off the event loop.

    The request header is parsed first (a malformed one is refused here, before any lookup);
    an unknown deal is refused from the cache's negative entries or after a read in its pool
    (:meth:`provider.deals.DealCache.aget`), never by a chain read on the loop.
    """
    task_request = headers.get(REQUEST_HEADER.lower())
    if task_request is None or headers.get(SIGNATURE_HEADER.lower()) is None:
        return  # check_headers names what is missing
    request, _ = daemon.service.checks.parse_request(task_request)
    await daemon.deals.aget(request.deal_id)


async def submit_answer(
    daemon: Daemon,
    headers: Mapping[str, str],
    wait: float,
    body: bytes,
    checked: CheckedRequest | None = None,
) -> bytes:
    """Submit a task from its HTTP pieces; return the JSON answer (``TaskPublic``).

    The call that creates the ack gets an access token and, with ``wait``, the result; a
    repeat of an acked request (its client's retry, or anyone who rebuilt the request from a
    claim's calldata) gets the ack alone, at once (:func:`provider.api.models.ack_only_json`).
    """
    if checked is None:
        await load_deal(daemon, headers)
        checked = check_headers(daemon, headers)
    # Waiting for the result: the ack may commit with the receipt (one commit); the
    # answer is built from settled_view, which makes a lone ack durable first.
    submission = daemon.service.submit(
        "",
        "",
        headers.get(TARGET_HEADER.lower()),
        body,
        defer_ack=wait > 0,
        checked=checked,
    )
    key = submission.record.key
    if not submission.created:
        return ack_only_json(daemon.service.view(key))
    view = await settled_view(daemon, key, wait)
    token = daemon.access.token(key, time.time())
    return task_json(view, daemon.journal, token, created=True)


class FastTasks:
    """Serve ``POST /v1/tasks`` directly; hand every other request to ``app``."""

    def __init__(self, app: ASGIApp, daemon: Daemon) -> None:
        """Wrap ``app`` (the FastAPI app of ``daemon``)."""
        self.app = app
        self.daemon = daemon
        http = daemon.config.http
        self.requests = RequestBudget(http.rate_per_ip, http.burst_per_ip)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Route one ASGI call, within its client address's request budget (429 beyond)."""
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        send = with_headers(send, SECURITY_HEADERS)  # the market's, for a JSON API
        client = scope.get("client")
        wait = self.requests.take(client[0] if client else "")
        if wait > 0:
            reason = f"too many requests from one client address; retry after {ceil(wait)} s"
            await _answer(send, *render("too_many_requests", reason, retry_after=ceil(wait)))
        elif scope["method"] == "POST" and scope["path"] == "/v1/tasks":
            await self._submit(scope, receive, send)
        else:
            await self._bounded(scope, receive, send)

    async def _bounded(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Hand a request to the app with its body read first, within the small cap.

        The body is refused (413) on its declared length before reading, or as soon as the
        bytes received pass the cap; a JSON body must say so (415) and be nested at most
        ``MAX_JSON_DEPTH`` deep (400), checked before any parser sees it.
        """
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
        try:
            _check_declared(headers, MAX_SMALL_BODY_BYTES, "body_too_large")
            body = await _read_body(receive, MAX_SMALL_BODY_BYTES, "body_too_large")
            if body is None:
                return
            if scope["method"] in _BODY_METHODS or body:
                if media_type(headers) != "application/json":
                    raise RejectedError("unsupported_media_type", "send application/json")
                if json_depth(body) > MAX_JSON_DEPTH:
                    raise RejectedError(
                        "bad_request", f"the JSON body is nested deeper than {MAX_JSON_DEPTH}"
                    )
        except RejectedError as exc:
            await _answer(send, *rejected_answer(exc))
            return
        sent = False

        async def replay() -> Message:
            nonlocal sent
            if sent:
                return await receive()
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}

        await self.app(scope, replay, send)

    async def _submit(self, scope: Scope, receive: Receive, send: Send) -> None:
        daemon = self.daemon
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
        try:
            query = parse_qs(scope["query_string"].decode("latin-1"))
            wait = parse_wait(query["wait"][-1] if "wait" in query else None)
            check_length(daemon, headers)
            check_envelope_type(headers)
            await load_deal(daemon, headers)
            checked = check_headers(daemon, headers)  # a stranger's body is never read
            with admit_upload(daemon, checked, headers) as cap:  # what its price allows
                body = await _read_body(receive, cap)
                if body is None:
                    return  # the client went away
                answer = await submit_answer(daemon, headers, wait, body, checked)
        except Exception as exc:  # every error is answered by the one renderer
            await _answer(send, *rejected_answer(exc))
            return
        await _answer(send, 200, answer)


async def _answer(
    send: Send, status: int, answer: bytes | dict[str, str], headers: dict[str, str] | None = None
) -> None:
    raw = answer if isinstance(answer, bytes) else json.dumps(answer, separators=(",", ":"))
    raw = raw if isinstance(raw, bytes) else raw.encode()
    extra = [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()]
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [_JSON, (b"content-length", str(len(raw)).encode()), *extra],
        }
    )
    await send({"type": "http.response.body", "body": raw})


async def _read_body(receive: Receive, cap: int, code: str = "envelope_too_large") -> bytes | None:
    return await read_streamed_body(
        receive, cap, lambda: RejectedError(code, f"more than {cap} bytes, cap {cap}")
    )
