"""Tasks: submit a signed task with its envelope as the raw body; fetch results (long-poll)."""

from __future__ import annotations

import asyncio
from concurrent.futures import Future
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request, Response

from provider.api.deps import DaemonDep, daemon_of
from provider.api.models import (
    REQUEST_HEADER,
    SIGNATURE_HEADER,
    TARGET_HEADER,
    TaskPublic,
    task_json,
)
from provider.daemon import Daemon
from provider.errors import RejectedError
from provider.service import TaskView

router = APIRouter(prefix="/v1/tasks", tags=["tasks"])
MAX_WAIT_S = 60.0

WaitQuery = Annotated[
    float, Query(ge=0, le=MAX_WAIT_S, description="seconds to wait for the result")
]


async def _settled_view(daemon: Daemon, key: tuple[int, int], wait: float) -> TaskView:
    view = daemon.service.view(key)
    if view.receipt is None and wait > 0:
        future = daemon.service.future(key)
        if future is not None:
            await _wait_done(future, wait)
            view = daemon.service.view(key)
    return view


async def _wait_done(future: Future[Any], timeout: float) -> None:
    """Wait until a task thread's future is done or ``timeout`` passes (whichever first).

    Lighter than ``wait_for(shield(wrap_future(...)))``: one loop future, one timer.
    """
    loop = asyncio.get_running_loop()
    waiter: asyncio.Future[None] = loop.create_future()

    def wake() -> None:
        if not waiter.done():
            waiter.set_result(None)

    future.add_done_callback(lambda _: loop.call_soon_threadsafe(wake))
    timer = loop.call_later(timeout, wake)
    try:
        await waiter
    finally:
        timer.cancel()


_HEADERS_DOC: dict[str, Any] = {
    "parameters": [
        {
            "name": REQUEST_HEADER,
            "in": "header",
            "required": True,
            "schema": {"type": "string"},
            "description": "the TaskRequest as JSON (contracts.messages.TaskRequest.to_json)",
        },
        {
            "name": SIGNATURE_HEADER,
            "in": "header",
            "required": True,
            "schema": {"type": "string"},
            "description": "the client's signature, 0x r||s||v",
        },
        {
            "name": TARGET_HEADER,
            "in": "header",
            "required": False,
            "schema": {"type": "string"},
            "description": "compile tasks: local, v5e:1x1, ...",
        },
    ],
    "requestBody": {
        "required": True,
        "content": {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}},
    },
}


def _json(view: TaskView, daemon: Daemon, *, created: bool = False) -> Response:
    return Response(task_json(view, daemon.journal, created=created), media_type="application/json")


@router.post("", response_model=TaskPublic, openapi_extra=_HEADERS_DOC)
async def submit_task(request: Request, wait: WaitQuery = 0.0) -> Response:
    """Submit a task: the body is the program envelope's raw bytes, the signed request in headers.

    Answers at once with the signed ack (``wait=0``), or waits up to ``wait`` seconds and
    returns the delivered result with it.
    """
    daemon = daemon_of(request)  # not a Depends: this is the hot path
    headers = request.headers
    task_request = headers.get(REQUEST_HEADER)
    signature = headers.get(SIGNATURE_HEADER)
    if task_request is None or signature is None:
        raise RejectedError("bad_request", f"{REQUEST_HEADER} and {SIGNATURE_HEADER} are required")
    length = headers.get("content-length")
    cap = daemon.config.max_envelope_bytes
    if length is not None and length.isdigit() and int(length) > cap:
        raise RejectedError("envelope_too_large", f"{length} bytes, cap {cap}")
    body = await request.body()
    submission = daemon.service.submit(task_request, signature, headers.get(TARGET_HEADER), body)
    view = await _settled_view(daemon, submission.record.key, wait)
    return _json(view, daemon, created=submission.created)


@router.get("/{deal_id}/{task_index}", response_model=TaskPublic)
async def get_task(
    deal_id: int, task_index: int, daemon: DaemonDep, wait: WaitQuery = 0.0
) -> Response:
    """Return a task's state; with ``wait``, long-poll until it is delivered."""
    view = await _settled_view(daemon, (deal_id, task_index), wait)
    return _json(view, daemon)


@router.get("/{deal_id}/{task_index}/outputs")
async def get_outputs(deal_id: int, task_index: int, daemon: DaemonDep) -> Response:
    """Return a delivered task's outputs as raw bytes (their sha256 is the receipt's hash)."""
    view = daemon.service.view((deal_id, task_index))
    if view.receipt is None:
        raise RejectedError("not_delivered", "the task has no result yet")
    return Response(daemon.journal.outputs(view.ack.key), media_type="application/octet-stream")
