"""Tasks: submit a signed task with its envelope as the raw body; fetch results (long-poll)."""

from __future__ import annotations

import time
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request, Response

from contracts.access import (
    ACCESS_EXPIRY_HEADER,
    ACCESS_SIGNATURE_HEADER,
    ACCESS_TOKEN_HEADER,
)
from provider.api.deps import DaemonDep, daemon_of
from provider.api.fast import (
    MAX_WAIT_S,
    check_envelope_type,
    check_headers,
    check_length,
    load_deal,
    submit_answer,
)
from provider.api.models import (
    REQUEST_HEADER,
    SIGNATURE_HEADER,
    TARGET_HEADER,
    DealId,
    TaskIndex,
    TaskPublic,
    task_json,
)
from provider.api.waiting import settled_view
from provider.daemon import Daemon
from provider.errors import RejectedError
from provider.uploads import admit_upload, read_request_body

router = APIRouter(prefix="/v1/tasks", tags=["tasks"])

WaitQuery = Annotated[
    float, Query(ge=0, le=MAX_WAIT_S, description="seconds to wait for the result")
]


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


_ACCESS_DOC: dict[str, Any] = {
    "parameters": [
        {
            "name": name,
            "in": "header",
            "required": False,
            "schema": {"type": "string"},
            "description": text,
        }
        for name, text in (
            (ACCESS_TOKEN_HEADER, "the access_token of the answer that created the ack"),
            (ACCESS_EXPIRY_HEADER, "or: unix seconds, at most 3600 s ahead"),
            (ACCESS_SIGNATURE_HEADER, "and the client's signature of result_access_digest"),
        )
    ],
    "responses": {
        "401": {"description": "no proof of being the deal's client"},
        "403": {"description": "a wrong, expired or foreign proof"},
    },
}


async def _authorize(daemon: Daemon, request: Request, key: tuple[int, int]) -> None:
    """Raise unless the caller proves to be the deal's client (token or fresh signature).

    Cheapest first: a token is checked without the deal; a signature is checked before its
    deal is looked up, and the lookup never reads the chain on the event loop.
    """
    signer = daemon.access.proven_signer(key, request.headers, time.time())
    if signer is not None:
        deal = await daemon.deals.aget(key[0])
        daemon.access.require_client(key, signer, deal.client)


@router.post("", response_model=TaskPublic, openapi_extra=_HEADERS_DOC)
async def submit_task(request: Request, wait: WaitQuery = 0.0) -> Response:
    """Submit a task: the body is the program envelope's raw bytes, the signed request in headers.

    Answers at once with the signed ack (``wait=0``), or waits up to ``wait`` seconds and
    returns the delivered result with it. Served by :class:`provider.api.fast.FastTasks`
    in front of the framework; this route declares its schema and runs the same code.
    """
    daemon = daemon_of(request)
    check_length(daemon, request.headers)
    check_envelope_type(request.headers)
    await load_deal(daemon, request.headers)
    checked = check_headers(daemon, request.headers)
    with admit_upload(daemon, checked, request.headers) as cap:  # what its price allows
        body = await read_request_body(request.stream(), cap)
        answer = await submit_answer(daemon, request.headers, wait, body, checked)
    return Response(answer, media_type="application/json")


@router.get("/{deal_id}/{task_index}", response_model=TaskPublic, openapi_extra=_ACCESS_DOC)
async def get_task(
    deal_id: DealId,
    task_index: TaskIndex,
    request: Request,
    daemon: DaemonDep,
    wait: WaitQuery = 0.0,
) -> Response:
    """Return a task's state to the deal's client; with ``wait``, long-poll until delivered.

    No access token is issued here: tokens come only with the ack that created the task.
    """
    key = (deal_id, task_index)
    await _authorize(daemon, request, key)
    view = await settled_view(daemon, key, wait)
    answer = task_json(view, daemon.journal, None)
    return Response(answer, media_type="application/json")


@router.get("/{deal_id}/{task_index}/outputs", openapi_extra=_ACCESS_DOC)
async def get_outputs(
    deal_id: DealId, task_index: TaskIndex, request: Request, daemon: DaemonDep
) -> Response:
    """Return a delivered task's outputs as raw bytes (their sha256 is the receipt's hash)."""
    await _authorize(daemon, request, (deal_id, task_index))
    view = daemon.service.view((deal_id, task_index))
    if view.receipt is None:
        raise RejectedError("not_delivered", "the task has no result yet")
    outputs = view.outputs if view.outputs is not None else daemon.journal.outputs(view.ack.key)
    return Response(outputs, media_type="application/octet-stream")
