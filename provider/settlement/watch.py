"""The watch job: what the chain did to a deal that the journal has not seen.

Claim batches the chain holds but the journal lost (a claim mined just before the daemon
died), refunds of overdue tasks, and deals closed on chain.
"""

from __future__ import annotations

import logging
from collections.abc import Collection
from typing import Any

from contracts.binding import DealState, DealStatus, TaskStatus
from contracts.errors import ChainError, ContractRevert
from provider.journal import DealBook, SettlementRecord
from provider.lifecycle import SettlementAction, SettlementEvent, SettlementStep
from provider.settlement.context import SettlementContext

log = logging.getLogger("provider.settlement")


class DealWatch:
    """Journal what the chain settled or closed behind the journal's back."""

    def __init__(self, ctx: SettlementContext) -> None:
        """Work through ``ctx``."""
        self.ctx = ctx

    def watch_deals(self, deals: Collection[int] | None = None) -> list[int]:
        """Journal lost claims and refunds of overdue tasks; record closed deals; return those."""
        closed = []
        with self.ctx.lock:
            chain_now = self.ctx.clock.chain_now()
            for deal_id, book in self.ctx.books(deals):
                state = self.ctx.state(deal_id, fresh=True)
                if state is None:
                    continue
                self._reconcile(deal_id, book, state)
                if state.status == DealStatus.CLOSED:
                    self.ctx.record(deal_id, SettlementAction.CLOSED, {}, None)
                    log.info("deal found closed on chain", extra={"deal": deal_id})
                    closed.append(deal_id)
                    continue
                self._sync_overdue(deal_id, book, state, chain_now)
        return closed

    def sync_overdue(self, deal_id: int) -> None:
        """Read the chain's state of a deal's tasks past their settlement instant; journal
        refunds (the task service calls this before refusing a task for budget)."""
        book = self.ctx.journal.deal(deal_id)  # no job lock: a pass in progress may hold it long
        state = self.ctx.state(deal_id)
        if book is not None and state is not None:
            self._sync_overdue(deal_id, book, state, self.ctx.clock.chain_now())

    def _sync_overdue(self, deal_id: int, book: DealBook, state: DealState, now: int) -> None:
        overdue = []
        for index in sorted(book.acks):
            settle = self.ctx.settle_by_of(book, index, state)
            if settle is not None and settle < now and not book.on_chain(index):
                overdue.append(index)
        if not overdue:
            return
        try:
            statuses = self.ctx.task_statuses(deal_id, overdue)
        except (ChainError, ContractRevert, ValueError) as exc:
            self.ctx.failed(SettlementStep.WATCH, deal_id, exc)
            return
        refunded = [i for i, s in zip(overdue, statuses, strict=True) if s == TaskStatus.REFUNDED]
        if refunded:
            refund = sum(book.acks[i].ack.price for i in refunded)
            penalty = state.penalty * len(refunded)
            self.ctx.record(
                deal_id,
                SettlementAction.REFUNDED,
                {"tasks": refunded, "refund": str(refund), "penalty": str(penalty)},
                None,
            )
            log.warning(
                "tasks refunded to the client, with the deal's penalty",
                extra={"deal": deal_id, "tasks": refunded, "refund": refund, "penalty": penalty},
            )
        for index, status in zip(overdue, statuses, strict=True):
            record = book.receipts.get(index)
            if status == TaskStatus.NONE and record is not None and record.on_time:
                self.ctx.warn_once(
                    "missed",
                    deal_id,
                    index,
                    "a delivered task passed its settlement instant off chain: the client may "
                    "refund it (only its voucher can still pay it)",
                )
            elif status in (TaskStatus.VOUCHED, TaskStatus.CLAIMED) and not book.on_chain(index):
                self.ctx.warn_once(
                    "unjournaled",
                    deal_id,
                    index,
                    "a task is settled on chain but not in the journal (reconciled by the "
                    "next redeem or claim reconciliation)",
                )

    def reconcile_claims(self) -> list[SettlementRecord]:
        """Journal every claim batch the chain holds and the journal lacks (run at start)."""
        done = []
        with self.ctx.lock:
            for deal_id, book in self.ctx.books():
                if not book.receipts:
                    continue
                state = self.ctx.state(deal_id, fresh=True)
                if state is not None:
                    done.extend(self._reconcile(deal_id, book, state))
        return done

    def _reconcile(self, deal_id: int, book: DealBook, state: DealState) -> list[SettlementRecord]:
        """Journal the deal's claim batches that exist on chain but not in the journal.

        A claim transaction mined just before the daemon died has no journal row: its tasks
        show as claimed on chain and its batch would never be finalized. The batch's
        ``ReceiptsClaimed`` event says what it claimed.
        """
        known = {
            int(s.data["batch_id"]) for s in book.settlements if s.action == SettlementAction.CLAIM
        }
        done = []
        for batch_id in range(state.batch_count):
            if batch_id in known:
                continue
            try:
                found = self._claim_on_chain(deal_id, batch_id)
            except (ChainError, ContractRevert, ValueError, KeyError) as exc:
                self.ctx.failed(SettlementStep.RECONCILE, deal_id, exc)
                continue
            if found is None:
                continue
            data, tx_hash = found
            record = self.ctx.journal.record_settlement(
                deal_id, SettlementAction.CLAIM, data, tx_hash
            )
            self.ctx.deals.invalidate(deal_id)
            self.ctx.metrics.settlements.labels(SettlementEvent.RECONCILED).inc()
            log.warning("claim found on chain, journaled", extra={"deal": deal_id, **data})
            done.append(record)
        return done

    def _claim_on_chain(self, deal_id: int, batch_id: int) -> tuple[dict[str, Any], str] | None:
        logs = self.ctx.escrow.tx.w3.eth.get_logs(
            {
                "address": self.ctx.escrow.address,
                "fromBlock": self.ctx.config.start_block,
                "toBlock": "latest",
                "topics": [
                    self.ctx.escrow.contract.events.ReceiptsClaimed.topic,
                    "0x" + deal_id.to_bytes(32, "big").hex(),
                    "0x" + batch_id.to_bytes(32, "big").hex(),
                ],
            }
        )
        if not logs:
            return None
        event = self.ctx.escrow.decode_events(logs[:1])[0].args
        data = {
            "batch_id": batch_id,
            "deadline": int(event["deadline"]),
            "amount": str(int(event["amount"])),
            "tasks": [int(i) for i in event["taskIndexes"]],
            "reconciled": True,
        }
        return data, "0x" + bytes(logs[0]["transactionHash"]).hex()
