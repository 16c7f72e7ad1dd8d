"""``POST /v1/tasks`` served straight from ASGI: the task hot path skips the framework.

The FastAPI route of the same path declares the schema (OpenAPI) and runs the same code
(:func:`submit_answer`) when the app is served without this wrapper; through :class:`FastTasks`
(:func:`provider.api.create_app`) the framework's middleware stack, routing and exception
handlers stay off the hot path.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from urllib.parse import parse_qs

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from provider.api.errors import STATUS_BY_CODE, error_body
from provider.api.models import REQUEST_HEADER, SIGNATURE_HEADER, TARGET_HEADER, task_json
from provider.api.waiting import settled_view
from provider.daemon import Daemon
from provider.errors import NotFoundError, ProviderError, RejectedError

MAX_WAIT_S = 60.0
_JSON = (b"content-type", b"application/json")


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
    length = headers.get("content-length")
    cap = daemon.config.max_envelope_bytes
    if length is not None and length.isdigit() and int(length) > cap:
        raise RejectedError("envelope_too_large", f"{length} bytes, cap {cap}")


async def submit_answer(
    daemon: Daemon, headers: Mapping[str, str], wait: float, body: bytes
) -> bytes:
    """Submit a task from its HTTP pieces; return the JSON answer (``TaskPublic``)."""
    task_request = headers.get(REQUEST_HEADER.lower())
    signature = headers.get(SIGNATURE_HEADER.lower())
    if task_request is None or signature is None:
        raise RejectedError("bad_request", f"{REQUEST_HEADER} and {SIGNATURE_HEADER} are required")
    # Waiting for the result: the ack may commit with the receipt (one commit); the
    # answer is built from settled_view, which makes a lone ack durable first.
    submission = daemon.service.submit(
        task_request, signature, headers.get(TARGET_HEADER.lower()), body, defer_ack=wait > 0
    )
    key = submission.record.key
    view = await settled_view(daemon, key, wait)
    return task_json(view, daemon.journal, daemon.access.token(key), created=submission.created)


class FastTasks:
    """Serve ``POST /v1/tasks`` directly; hand every other request to ``app``."""

    def __init__(self, app: ASGIApp, daemon: Daemon) -> None:
        """Wrap ``app`` (the FastAPI app of ``daemon``)."""
        self.app = app
        self.daemon = daemon

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Route one ASGI call."""
        if scope["type"] == "http" and scope["method"] == "POST" and scope["path"] == "/v1/tasks":
            await self._submit(scope, receive, send)
        else:
            await self.app(scope, receive, send)

    async def _submit(self, scope: Scope, receive: Receive, send: Send) -> None:
        daemon = self.daemon
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
        try:
            query = parse_qs(scope["query_string"].decode("latin-1"))
            wait = parse_wait(query["wait"][-1] if "wait" in query else None)
            check_length(daemon, headers)
            body = await _read_body(receive, daemon.config.max_envelope_bytes)
            if body is None:
                return  # the client went away
            status, answer = 200, await submit_answer(daemon, headers, wait, body)
        except RejectedError as exc:
            status = STATUS_BY_CODE.get(exc.code, 400)
            answer = _error(exc.code, exc.reason)
        except NotFoundError as exc:
            status, answer = 404, _error("not_found", str(exc))
        except ProviderError as exc:
            status, answer = 500, _error("provider_error", str(exc))
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [_JSON, (b"content-length", str(len(answer)).encode())],
            }
        )
        await send({"type": "http.response.body", "body": answer})


async def _read_body(receive: Receive, cap: int) -> bytes | None:
    chunks: list[bytes] = []
    size = 0
    while True:
        message: Message = await receive()
        if message["type"] == "http.disconnect":
            return None
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > cap:
            raise RejectedError("envelope_too_large", f"more than {cap} bytes, cap {cap}")
        chunks.append(chunk)
        if not message.get("more_body", False):
            return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def _error(code: str, reason: str) -> bytes:
    return json.dumps(error_body(code, reason), separators=(",", ":")).encode()
