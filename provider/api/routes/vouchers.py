"""Vouchers and deal summaries."""

from __future__ import annotations

import json
import time
from typing import Any

from fastapi import APIRouter, Request
from starlette.concurrency import run_in_threadpool

from contracts.access import ACCESS_EXPIRY_HEADER, ACCESS_SIGNATURE_HEADER
from provider.access import DEAL_SCOPE
from provider.api.deps import DaemonDep
from provider.api.models import DealId, DealPublic, VoucherIn, VoucherPublic
from provider.errors import NotFoundError
from provider.receipts import voucher_tasks

router = APIRouter(prefix="/v1", tags=["settlement"])

_DEAL_ACCESS_DOC: dict[str, Any] = {
    "parameters": [
        {
            "name": ACCESS_EXPIRY_HEADER,
            "in": "header",
            "required": True,
            "schema": {"type": "string"},
            "description": "unix seconds, at most 3600 s ahead",
        },
        {
            "name": ACCESS_SIGNATURE_HEADER,
            "in": "header",
            "required": True,
            "schema": {"type": "string"},
            "description": (
                "the deal's client's or provider's signature of result_access_digest(domain, "
                f"deal, {DEAL_SCOPE:#x}, expiry)"
            ),
        },
    ],
    "responses": {
        "401": {"description": "no proof of being a party to the deal"},
        "403": {"description": "a wrong, expired or foreign proof"},
    },
}


@router.post("/vouchers", response_model=VoucherPublic)
async def post_voucher(body: VoucherIn, daemon: DaemonDep) -> VoucherPublic:
    """Accept a signed cumulative voucher for delivered tasks.

    Its shape is checked first (:class:`VoucherIn`), then its deal is looked up off the event
    loop (:meth:`provider.deals.DealCache.aget`), then it is checked in a worker thread: a
    large bitmap's checks never hold the event loop.
    """
    deal_id = body.voucher.get("deal_id")
    if isinstance(deal_id, int) and not isinstance(deal_id, bool) and 0 <= deal_id < 2**256:
        await daemon.deals.aget(deal_id)
    record, new = await run_in_threadpool(
        daemon.service.accept_voucher, json.dumps(body.voucher), body.signature
    )
    return VoucherPublic(
        deal_id=record.voucher.deal_id,
        cumulative_amount=str(record.voucher.cumulative_amount),
        tasks=voucher_tasks(record.voucher),
        new=new,
    )


@router.get("/deals/{deal_id}", response_model=DealPublic, openapi_extra=_DEAL_ACCESS_DOC)
async def get_deal(deal_id: DealId, request: Request, daemon: DaemonDep) -> DealPublic:
    """Summarize what the journal holds for a deal, to the deal's client or provider."""

    signer = daemon.access.deal_signer(deal_id, request.headers, time.time())
    deal = await daemon.deals.aget(deal_id)  # after the proof: a stranger's costs no lookup
    daemon.access.require_party(deal_id, signer, (deal.client, deal.provider))
    book = daemon.journal.deal(deal_id)
    if book is None:
        raise NotFoundError(f"the journal has no deal {deal_id}")
    latest = book.latest_voucher
    redeemed = book.redeemed()
    return DealPublic(
        deal_id=deal_id,
        acked=len(book.acks),
        delivered=len(book.receipts),
        receipted_amount=str(sum(r.receipt.amount for r in book.receipts.values())),
        vouched_amount=str(0 if latest is None else latest.voucher.cumulative_amount),
        redeemed_amount=str(0 if redeemed is None else redeemed.voucher.cumulative_amount),
        claimed_tasks=sorted(book.claimed_tasks()),
        chain_head="0x" + book.last_receipt_hash.hex(),
        closed=book.closed(),
    )
