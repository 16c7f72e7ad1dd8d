"""The claim job: claim delivered, on-time tasks that no acceptable voucher covers.

A task is claimed once it reaches ``settleBy - margin``, up to ``claim_batch_max`` per
transaction, each with the client's signed request. No task stops another's claim: a task
whose status read reverts is set aside, the batch is simulated first and each task that makes
it revert is set aside (:mod:`provider.settlement.claim_check`); a task the chain still refuses
when sent is dropped from the batch, which is sent again.
"""

from __future__ import annotations

import logging
from collections.abc import Collection
from typing import Final

from contracts.binding import DealState, TaskStatus
from contracts.errors import ChainError, ContractRevert
from contracts.messages import Plan
from provider.journal import DealBook, ReceiptRecord, SettlementRecord
from provider.lifecycle import SettlementAction, SettlementStep
from provider.receipts import settle_by
from provider.settlement.claim_check import ClaimCheck
from provider.settlement.context import SettlementContext

log = logging.getLogger("provider.settlement")

CLAIM_ATTEMPTS: Final = 4
"""Sends of one batch at most: it is sent again without each task the chain refused."""


class ReceiptClaims:
    """Claim on chain, with the client's signed requests, what no voucher pays in time."""

    def __init__(self, ctx: SettlementContext) -> None:
        """Work through ``ctx``."""
        self.ctx = ctx
        self.check = ClaimCheck(ctx)

    def claim_due(
        self, *, force: bool = False, deals: Collection[int] | None = None
    ) -> list[SettlementRecord]:
        """Claim delivered, on-time tasks no acceptable voucher covers, once they are due.

        Due: the task reaches ``settleBy - margin``; ``force`` claims every claimable task.
        """
        done = []
        with self.ctx.lock:
            chain_now = self.ctx.clock.chain_now()
            now = self.ctx.clock.now()
            for deal_id, book, state, plan in self.ctx.open_deals(deals):
                candidates = self._claimable(deal_id, book, state, now, chain_now, force=force)
                size = self.ctx.config.claim_batch_max
                for start in range(0, len(candidates), size):
                    record = self._claim(deal_id, book, plan, candidates[start : start + size])
                    if record is not None:
                        done.append(record)
        return done

    def _claimable(
        self,
        deal_id: int,
        book: DealBook,
        state: DealState,
        now: float,
        chain_now: int,
        *,
        force: bool,
    ) -> list[ReceiptRecord]:
        latest = book.latest_voucher
        out = []
        for index, record in sorted(book.receipts.items()):
            ack = book.acks.get(index)
            if ack is None or index in book.claiming or book.on_chain(index):
                continue
            if latest is not None and latest.voucher.covers(index):
                continue  # the voucher pays it: redeem_due puts it on chain
            if not record.on_time:
                continue  # only a voucher can pay a late delivery
            settle = settle_by(ack.request.deadline, state.expiry, state.challenge_window)
            # Past its settlement instant by the chain's clock or by ours (ours is never behind
            # the chain's; the last block's time may be, on an idle chain), a claim would revert.
            if settle < max(chain_now, int(now)) or not (
                force or self.ctx.act_by(settle, state) <= now
            ):
                continue
            if not ack.claimable:
                self.ctx.warn_once(
                    "v1",
                    deal_id,
                    index,
                    "a task acked under settlement protocol v1 cannot be claimed under v2: "
                    "only a voucher pays it",
                )
                continue
            if record.receipt.amount > ack.request.max_price:
                self.ctx.warn_once(
                    "price",
                    deal_id,
                    index,
                    "a receipt's amount is above the request's maxPrice: it cannot be claimed",
                )
                continue
            out.append(record)
        return out

    def _claim(
        self, deal_id: int, book: DealBook, plan: Plan, batch: list[ReceiptRecord]
    ) -> SettlementRecord | None:
        """Claim one batch; the tasks stay marked ``claiming`` until the claim is journaled."""
        with self.ctx.journal.lock:  # vouchers are accepted under this lock: none covers these
            latest = book.latest_voucher
            batch = [
                r
                for r in batch
                if r.receipt.task_index not in book.claiming
                and not book.on_chain(r.receipt.task_index)
                and not (latest is not None and latest.voucher.covers(r.receipt.task_index))
            ]
            marked = {r.receipt.task_index for r in batch}
            book.claiming |= marked
        try:
            return self._send_claim(deal_id, book, plan, batch)
        finally:
            with self.ctx.journal.lock:
                book.claiming -= marked

    def _send_claim(
        self, deal_id: int, book: DealBook, plan: Plan, batch: list[ReceiptRecord]
    ) -> SettlementRecord | None:
        if not batch:
            return None
        try:
            statuses = self.ctx.task_statuses(deal_id, [r.receipt.task_index for r in batch])
        except (ChainError, ContractRevert, ValueError) as exc:
            self.ctx.failed(SettlementStep.CLAIM, deal_id, exc)
            return None
        batch = [r for r, s in zip(batch, statuses, strict=True) if s == TaskStatus.NONE]
        try:
            batch = self.check.settleable(deal_id, book, plan, batch)
        except ChainError as exc:
            self.ctx.failed(SettlementStep.CLAIM, deal_id, exc)
            return None
        for attempt in range(CLAIM_ATTEMPTS):
            if not batch:
                return None
            claims = self.check.claims(book, batch)
            try:
                tx = self.ctx.escrow.claim_receipts(self.ctx.private_key, deal_id, plan, claims)
                break
            except ContractRevert as exc:
                refused = exc.error_args.get("taskIndex")
                if refused is None or attempt == CLAIM_ATTEMPTS - 1:
                    self.ctx.failed(SettlementStep.CLAIM, deal_id, exc)
                    return None
                batch = [r for r in batch if r.receipt.task_index != int(str(refused))]
                log.warning(
                    "claim refused a task: sent again without it",
                    extra={"deal": deal_id, "task": int(str(refused)), "error": str(exc)},
                )
            except ChainError as exc:
                self.ctx.failed(SettlementStep.CLAIM, deal_id, exc)
                return None
        else:  # every attempt either breaks or returns: this is never reached
            return None
        event = tx.event("ReceiptsClaimed").args
        claimed = self.ctx.record(
            deal_id,
            SettlementAction.CLAIM,
            {
                "batch_id": int(event["batchId"]),
                "deadline": int(event["deadline"]),
                "amount": str(int(event["amount"])),
                "tasks": [int(i) for i in event["taskIndexes"]],
            },
            tx.tx_hash,
        )
        log.info(
            "tasks claimed",
            extra={
                "deal": deal_id,
                "batch": int(event["batchId"]),
                "tasks": len(batch),
                "amount": int(event["amount"]),
                "payable_at": int(event["deadline"]),
                "tx": tx.tx_hash,
            },
        )
        return claimed
