"""The arbiter's HTTP API: its terms, each case's state, evidence uploads and rulings.

- ``GET /v1/info``: the arbiter's address, chain, escrow, deadlines and tolerance policy.
- ``GET /v1/cases/{deal}/{batch}``: a dispute's deadlines and which evidence is still missing
  (all of it public on chain already: indexes and instants, never payloads).
- ``PUT /v1/evidence/{deal}/{batch}/{task}/program``: the client's program envelope (raw body;
  ``X-Tpumarket-Target`` for compile tasks), signed over ``contracts.evidence.evidence_digest``.
- ``PUT /v1/evidence/{deal}/{batch}/{task}/outputs``: the provider's outputs, signed likewise.
- ``GET /v1/rulings/{deal}/{batch}``: the ruling document and its transaction; its keccak256 is
  appended to the ``resolveDispute`` calldata on chain.
- ``GET /v1/rulings/{deal}/{batch}/outputs/{task}``: outputs of a batch ruled for the provider,
  released to the deal's client on a fresh signature (``ruling_read_digest``, expiry <= 1 h).
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import tempfile
import time
from pathlib import Path
from typing import Annotated, Any

from fastapi import FastAPI, Header, Request
from fastapi import Path as PathParam
from fastapi.responses import JSONResponse, Response

from contracts.errors import SignatureError
from contracts.evidence import (
    EVIDENCE_SIGNATURE_HEADER,
    EVIDENCE_TARGET_HEADER,
    READ_EXPIRY_HEADER,
    READ_SIGNATURE_HEADER,
    Role,
    ruling_read_digest,
)
from contracts.hashing import keccak256
from contracts.messages import recover_digest
from programs.envelope import MAX_ENVELOPE_BYTES, check_target_name
from provider.arbiter.errors import EvidenceRefused
from provider.arbiter.journal import CaseState
from provider.arbiter.service import Arbiter, ruling_bytes

MAX_READ_TTL_S = 3600
DealId = Annotated[int, PathParam(ge=1, lt=2**256)]
BatchId = Annotated[int, PathParam(ge=0, lt=2**32)]
TaskIndex = Annotated[int, PathParam(ge=0, lt=2**32)]


def _error(status: int, code: str, reason: str) -> JSONResponse:
    headers = {"Retry-After": "5"} if status in (404, 503) else None
    return JSONResponse({"error": code, "reason": reason}, status_code=status, headers=headers)


def _signature(text: str | None) -> bytes:
    if not text:
        raise EvidenceRefused(
            401, "no_signature", f"send the signature in {EVIDENCE_SIGNATURE_HEADER}"
        )
    try:
        raw = bytes.fromhex(text.removeprefix("0x"))
    except ValueError:
        raise EvidenceRefused(400, "bad_signature", "the signature is not hex") from None
    if len(raw) != 65:
        raise EvidenceRefused(400, "bad_signature", "a signature is 65 bytes (r||s||v)")
    return raw


def create_app(arbiter: Arbiter, *, upload_dir: Path | None = None) -> FastAPI:
    """Return the API serving ``arbiter``."""
    app = FastAPI(title="tpumarket arbiter", version="1")
    spool = upload_dir or arbiter.journal.evidence_dir

    @app.exception_handler(EvidenceRefused)
    async def _refused(_request: Request, exc: EvidenceRefused) -> JSONResponse:
        return _error(exc.status, exc.code, exc.reason)

    @app.get("/v1/info")
    async def info() -> dict[str, Any]:
        terms = arbiter.terms
        return {
            "arbiter": arbiter.address,
            "chain_id": arbiter.domain.chain_id,
            "escrow": arbiter.domain.verifying_contract,
            "evidence_window_s": terms.evidence_window_s,
            "ruling_margin_s": terms.ruling_margin_s,
            "tolerance": terms.tolerance.as_json(),
            "fee": terms.fee,
        }

    @app.get("/v1/cases/{deal_id}/{batch_id}")
    async def case(deal_id: DealId, batch_id: BatchId) -> dict[str, Any]:
        found = arbiter.journal.case(deal_id, batch_id)
        if found is None:
            raise EvidenceRefused(404, "unknown_case", "no dispute of this batch names me (yet)")
        dispute = found.dispute
        return {
            "deal": deal_id,
            "batch": batch_id,
            "state": str(found.state),
            "tasks": [t.receipt.task_index for t in dispute.tasks],
            "disputed_at": dispute.disputed_at,
            "evidence_deadline": arbiter.terms.evidence_deadline(dispute),
            "arbitration_deadline": dispute.arbitration_deadline,
            "missing": arbiter.missing(found),
        }

    async def _upload(
        request: Request, deal_id: int, batch_id: int, task: int, role: Role
    ) -> dict[str, Any]:
        signature = _signature(request.headers.get(EVIDENCE_SIGNATURE_HEADER))
        target = request.headers.get(EVIDENCE_TARGET_HEADER)
        if target is not None:
            try:
                check_target_name(target)
            except ValueError as exc:
                raise EvidenceRefused(400, "bad_target", str(exc)) from None
        if arbiter.journal.case(deal_id, batch_id) is None:
            raise EvidenceRefused(404, "unknown_case", "no dispute of this batch names me (yet)")
        fd, name = tempfile.mkstemp(prefix=".upload-", dir=spool)
        temp = Path(name)
        digest = hashlib.sha256()
        size = 0
        try:
            with os.fdopen(fd, "wb") as out:
                async for chunk in request.stream():
                    size += len(chunk)
                    if size > MAX_ENVELOPE_BYTES:
                        raise EvidenceRefused(413, "too_large", f"over {MAX_ENVELOPE_BYTES} bytes")
                    digest.update(chunk)
                    out.write(chunk)
            await asyncio.to_thread(
                arbiter.accept,
                (deal_id, batch_id),
                task,
                role,
                temp,
                digest.digest(),
                signature,
                target,
            )
        finally:
            temp.unlink(missing_ok=True)
        return {"stored": True, "sha256": digest.hexdigest(), "bytes": size}

    @app.put("/v1/evidence/{deal_id}/{batch_id}/{task}/program")
    async def program(
        request: Request, deal_id: DealId, batch_id: BatchId, task: TaskIndex
    ) -> dict[str, Any]:
        return await _upload(request, deal_id, batch_id, task, Role.CLIENT_PROGRAM)

    @app.put("/v1/evidence/{deal_id}/{batch_id}/{task}/outputs")
    async def outputs(
        request: Request, deal_id: DealId, batch_id: BatchId, task: TaskIndex
    ) -> dict[str, Any]:
        return await _upload(request, deal_id, batch_id, task, Role.PROVIDER_OUTPUTS)

    @app.get("/v1/rulings/{deal_id}/{batch_id}")
    async def ruling(deal_id: DealId, batch_id: BatchId) -> Response:
        found = arbiter.journal.case(deal_id, batch_id)
        if found is None or found.ruling is None:
            raise EvidenceRefused(404, "not_ruled", "this batch has no ruling yet")
        body = {
            "ruling": found.ruling,
            "document_keccak256": "0x" + keccak256(ruling_bytes(found.ruling)).hex(),
            "tx_hash": found.tx_hash,
            "state": str(found.state),
        }
        return JSONResponse(body)

    @app.get("/v1/rulings/{deal_id}/{batch_id}/outputs/{task}")
    async def released(
        deal_id: DealId,
        batch_id: BatchId,
        task: TaskIndex,
        expiry: Annotated[int | None, Header(alias=READ_EXPIRY_HEADER)] = None,
        signature: Annotated[str | None, Header(alias=READ_SIGNATURE_HEADER)] = None,
    ) -> Response:
        found = arbiter.journal.case(deal_id, batch_id)
        if found is None or found.state is not CaseState.DONE or found.ruling is None:
            raise EvidenceRefused(404, "not_ruled", "this batch has no ruling on chain yet")
        if not found.ruling["provider_wins"]:
            raise EvidenceRefused(404, "not_released", "outputs are released only when upheld")
        now = int(time.time())
        if expiry is None or signature is None:
            raise EvidenceRefused(401, "no_proof", "sign ruling_read_digest with an expiry")
        if not now <= expiry <= now + MAX_READ_TTL_S:
            raise EvidenceRefused(403, "bad_expiry", f"expiry must be within {MAX_READ_TTL_S} s")
        digest = ruling_read_digest(arbiter.domain, deal_id, batch_id, expiry)
        try:
            signer = recover_digest(digest, _signature(signature))
        except SignatureError:
            raise EvidenceRefused(403, "bad_signature", "the signature does not recover") from None
        if signer.lower() != found.dispute.client.lower():
            raise EvidenceRefused(403, "not_client", "outputs are released to the deal's client")
        stored = arbiter.journal.evidence(found.key).get((task, Role.PROVIDER_OUTPUTS))
        if stored is None:
            raise EvidenceRefused(404, "no_outputs", f"no outputs of task {task} in this case")
        data = await asyncio.to_thread(stored.path.read_bytes)
        return Response(data, media_type="application/octet-stream")

    return app
