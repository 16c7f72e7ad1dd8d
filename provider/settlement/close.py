"""The close job: close deals the client agreed to close, and deals past their expiry.

A deal the client agreed to close closes once every task is on chain or past its settlement
instant and no claim is pending; any deal closes past ``expiry + 2 x challengeWindow``. Before
closing, the latest voucher is redeemed and, on an early close, what no voucher pays is claimed.
"""

from __future__ import annotations

import logging
from collections.abc import Collection

from contracts.binding import DealState, DealStatus
from contracts.errors import ChainError, ContractRevert
from provider.journal import DealBook
from provider.lifecycle import SettlementAction, SettlementStep
from provider.receipts import settle_by
from provider.settlement.claim import ReceiptClaims
from provider.settlement.context import SettlementContext
from provider.settlement.finalize import ClaimFinalization
from provider.settlement.redeem import VoucherRedemption

log = logging.getLogger("provider.settlement")


class DealClosing:
    """Close the deals that are done, settling what is left of them first."""

    def __init__(
        self,
        ctx: SettlementContext,
        *,
        redemption: VoucherRedemption,
        claims: ReceiptClaims,
        finalization: ClaimFinalization,
    ) -> None:
        """Work through ``ctx``, settling with the other jobs before a close."""
        self.ctx = ctx
        self.redemption = redemption
        self.claims = claims
        self.finalization = finalization

    def close_deals(self, deals: Collection[int] | None = None) -> list[int]:
        """Close deals the client agreed to close, and deals past expiry + 2 windows.

        Before closing: redeem the latest voucher; on an early close also claim what no
        voucher pays (the close then waits for those claims to finalize); finalize claims
        whose window passed. A deal with a task still running (before its settlement
        instant), claims pending or a voucher not yet redeemed is left for the next pass.
        Deals without any task (discovered on chain) close the same way; ``deals`` limits the
        pass to those deals. Return the deals closed.
        """
        with self.ctx.lock:
            chain_now = self.ctx.clock.chain_now()
            now = max(float(chain_now), self.ctx.clock.now())
            due: dict[int, bool] = {}  # deal -> past expiry + 2 windows (a unilateral close)
            for deal_id, _ in self.ctx.books(deals):
                state = self.ctx.state(deal_id, fresh=True)
                if state is None or state.status != DealStatus.OPEN:
                    continue
                alone = now >= state.expiry + 2 * state.challenge_window
                if state.client_agreed_close or alone:
                    due[deal_id] = alone
            if not due:
                return []
            self.redemption.redeem_due(force=True, deals=due)
            self.claims.claim_due(force=True, deals=[d for d, alone in due.items() if not alone])
            self.finalization.finalize_claims(deals=due)
            return [d for d, alone in due.items() if self._close(d, alone, chain_now)]

    def _close(self, deal_id: int, alone: bool, chain_now: int) -> bool:
        book = self.ctx.journal.deal(deal_id)
        state = self.ctx.state(deal_id, fresh=True)
        if book is None or book.closed() or state is None or state.status != DealStatus.OPEN:
            return False
        latest = book.latest_voucher
        if state.pending or (
            latest is not None and state.vouched < latest.voucher.cumulative_amount
        ):
            return False  # claims in their window, or a voucher left to redeem: not yet
        if not alone and self._work_left(book, state, chain_now):
            return False
        try:
            tx = self.ctx.escrow.close_deal(self.ctx.private_key, deal_id)
            event = tx.event("DealClosed").args
        except (ContractRevert, ChainError, KeyError) as exc:
            self.ctx.failed(SettlementStep.CLOSE, deal_id, exc)
            return False
        self.ctx.record(
            deal_id,
            SettlementAction.CLOSED,
            {
                "by": "provider",
                "returned_to_client": str(int(event["returnedToClient"])),
                "stake_returned": str(int(event["stakeReturned"])),
            },
            tx.tx_hash,
        )
        log.info(
            "deal closed",
            extra={
                "deal": deal_id,
                "expired": alone,
                "returned_to_client": int(event["returnedToClient"]),
                "stake_returned": int(event["stakeReturned"]),
                "tx": tx.tx_hash,
            },
        )
        return True

    def _work_left(self, book: DealBook, state: DealState, chain_now: int) -> bool:
        """Return whether a task not on chain can still be delivered or claimed."""
        for index, ack in book.acks.items():
            if book.on_chain(index):
                continue
            settle = settle_by(ack.request.deadline, state.expiry, state.challenge_window)
            if settle < chain_now:
                continue  # its settlement instant passed: nothing more to do for it
            record = book.receipts.get(index)
            if record is None or (record.on_time and ack.claimable):
                return True  # still running, or delivered and claimable (a claim failed)
        return False
