"""Vouchers and deal summaries."""

from __future__ import annotations

import json

from fastapi import APIRouter

from provider.api.deps import DaemonDep
from provider.api.models import DealPublic, VoucherIn, VoucherPublic
from provider.errors import NotFoundError
from provider.receipts import voucher_tasks

router = APIRouter(prefix="/v1", tags=["settlement"])


@router.post("/vouchers", response_model=VoucherPublic)
async def post_voucher(body: VoucherIn, daemon: DaemonDep) -> VoucherPublic:
    """Accept a signed cumulative voucher for delivered tasks."""
    record, new = daemon.service.accept_voucher(json.dumps(body.voucher), body.signature)
    return VoucherPublic(
        deal_id=record.voucher.deal_id,
        cumulative_amount=str(record.voucher.cumulative_amount),
        tasks=voucher_tasks(record.voucher),
        new=new,
    )


@router.get("/deals/{deal_id}", response_model=DealPublic)
async def get_deal(deal_id: int, daemon: DaemonDep) -> DealPublic:
    """Summarize what the journal holds for a deal."""
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
