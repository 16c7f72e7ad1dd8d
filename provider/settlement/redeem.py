"""The redeem job: put the latest acceptable voucher on chain once it is due.

Due: a task it newly pays reaches ``settleBy - margin``, or its increase reaches
``redeem_threshold``. A voucher the escrow refuses is journaled ``voucher_unusable`` and its
tasks are claimed instead; so is one that would leave the deal's cap short of the other acked
tasks (the task service refuses those; a journal of an older daemon may hold one).
"""

from __future__ import annotations

import logging
from collections.abc import Collection

from contracts.binding import DealState
from contracts.errors import ChainError, ContractRevert
from contracts.messages import Plan
from contracts.reverts import EscrowDealNotOpen, EscrowStaleVoucher
from provider.journal import DealBook, SettlementRecord, VoucherRecord
from provider.lifecycle import SettlementAction, SettlementStep
from provider.receipts import cap_free, settle_by, voucher_tasks
from provider.settlement.context import SettlementContext

log = logging.getLogger("provider.settlement")


class VoucherRedemption:
    """Redeem each deal's latest acceptable voucher where it is due."""

    def __init__(self, ctx: SettlementContext) -> None:
        """Work through ``ctx``."""
        self.ctx = ctx

    def redeem_due(
        self, *, force: bool = False, deals: Collection[int] | None = None
    ) -> list[SettlementRecord]:
        """Redeem each deal's latest acceptable voucher where it is due.

        Due: a task it newly pays reaches ``settleBy - margin``, or its increase over the
        last redeemed voucher reaches ``redeem_threshold``; ``force`` redeems any increase.
        """
        done = []
        with self.ctx.lock:
            self.ctx.clock.chain_now()
            now = self.ctx.clock.now()
            for deal_id, book, state, plan in self.ctx.open_deals(deals):
                latest = book.latest_voucher
                if latest is None:
                    continue
                if self._leaves_cap_short(deal_id, book, state, plan, latest):
                    latest = book.latest_voucher  # the one before: its tasks are claimed
                    if latest is None:
                        continue
                redeemed = book.redeemed()
                base = 0 if redeemed is None else redeemed.voucher.cumulative_amount
                increase = latest.voucher.cumulative_amount - base
                if increase <= 0:
                    continue
                if not (
                    force
                    or increase >= self.ctx.config.redeem_threshold
                    or self._voucher_due(book, latest, state, now)
                ):
                    continue
                record = self._redeem(deal_id, latest, increase)
                if record is not None:
                    done.append(record)
        return done

    def _leaves_cap_short(
        self, deal_id: int, book: DealBook, state: DealState, plan: Plan, latest: VoucherRecord
    ) -> bool:
        """Journal ``latest`` unusable if redeeming it would leave the deal's cap short of the
        other acked tasks while the voucher before it would not, and every task it newly
        covers can still be claimed; return whether it did.

        The task service refuses such a voucher (``voucher_leaves_cap_short``); this guards a
        journal written by a daemon that accepted one. Its tasks are claimed instead, so every
        delivered task is paid its receipt.
        """
        fee = plan.reservation_fee
        if cap_free(book, latest.voucher, max_spend=state.max_spend, reservation_fee=fee) >= 0:
            return False
        unusable = book.unusable_vouchers()
        before = next(
            (v for v in reversed(book.vouchers) if v.seq < latest.seq and v.seq not in unusable),
            None,
        )
        fallback = None if before is None else before.voucher
        if cap_free(book, fallback, max_spend=state.max_spend, reservation_fee=fee) < 0:
            return False  # short either way: the voucher pays more now
        chain_now = self.ctx.clock.chain_now()
        for index in voucher_tasks(latest.voucher):
            if book.on_chain(index) or (fallback is not None and fallback.covers(index)):
                continue
            ack, record = book.acks.get(index), book.receipts.get(index)
            if (
                ack is None
                or record is None
                or not (record.on_time and ack.claimable)
                or record.receipt.amount > ack.request.max_price
                or settle_by(ack.request.deadline, state.expiry, state.challenge_window) < chain_now
            ):
                return False  # only this voucher can still pay that task
        self.ctx.record(
            deal_id,
            SettlementAction.VOUCHER_UNUSABLE,
            {
                "voucher_seq": latest.seq,
                "error": "cap_short",
                "reason": "redeemed, it would leave the cap short of the other acked tasks",
            },
            None,
        )
        log.warning(
            "voucher not redeemed: it pays more than its tasks and would leave the cap short "
            "of the other acked tasks; its tasks are claimed instead",
            extra={"deal": deal_id, "cumulative": latest.voucher.cumulative_amount},
        )
        return True

    def _voucher_due(
        self, book: DealBook, voucher: VoucherRecord, state: DealState, now: float
    ) -> bool:
        for index in voucher_tasks(voucher.voucher):
            if book.on_chain(index):
                continue
            settle = self.ctx.settle_by_of(book, index, state)
            if settle is not None and self.ctx.act_by(settle, state) <= now:
                return True
        return False

    def _redeem(
        self, deal_id: int, latest: VoucherRecord, increase: int
    ) -> SettlementRecord | None:
        voucher = latest.voucher
        try:
            tx = self.ctx.escrow.redeem_voucher(self.ctx.private_key, voucher, latest.signature)
            paid = int(tx.event("VoucherRedeemed").args["paid"])
            tx_hash: str | None = tx.tx_hash
        except EscrowStaleVoucher as exc:
            # Redeemed already (the daemon died after sending): the chain says so.
            fresh = self.ctx.state(deal_id, fresh=True)
            if fresh is None or fresh.vouched < voucher.cumulative_amount:
                self.ctx.failed(SettlementStep.REDEEM, deal_id, exc)
                return None
            paid, tx_hash = increase, None
        except EscrowDealNotOpen:
            return None  # closed: the watch job records it
        except ContractRevert as exc:
            # The escrow refuses this voucher for good (a task it covers was settled
            # otherwise, the cap is spent...): its tasks fall back to claims.
            self.ctx.record(
                deal_id,
                SettlementAction.VOUCHER_UNUSABLE,
                {"voucher_seq": latest.seq, "error": exc.error_name, "reason": str(exc)},
                None,
            )
            self.ctx.failed(SettlementStep.REDEEM, deal_id, exc)
            return None
        except ChainError as exc:
            self.ctx.failed(SettlementStep.REDEEM, deal_id, exc)
            return None
        record = self.ctx.record(
            deal_id,
            SettlementAction.REDEEM,
            {
                "voucher_seq": latest.seq,
                "cumulative": str(voucher.cumulative_amount),
                "paid": str(paid),
            },
            tx_hash,
        )
        log.info(
            "voucher redeemed",
            extra={
                "deal": deal_id,
                "paid": paid,
                "cumulative": voucher.cumulative_amount,
                "tx": tx_hash,
            },
        )
        return record
