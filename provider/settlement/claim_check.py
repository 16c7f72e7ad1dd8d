"""Simulate a claim batch before it is sent, and set aside the tasks that make it revert.

One task the escrow refuses (a receipt it would not pay, a request signature that no longer
verifies, a task settled otherwise) would revert the whole batch, and every other task in it
would go unclaimed until the client could refund it. So a batch is first run as a call
(``eth_call`` from the provider, at the pending block); on a revert that names a task, that
task is set aside; on one that names none, the batch is split in halves, each checked alone,
down to the tasks that revert by themselves. What remains is claimed.
"""

from __future__ import annotations

from collections.abc import Sequence

from contracts.errors import CallRevertedError, ContractRevert, EscrowError
from contracts.messages import Claim, Plan
from provider.journal import DealBook, ReceiptRecord
from provider.settlement.context import SettlementContext

Revert = ContractRevert | CallRevertedError


class ClaimCheck:
    """Find the part of a claim batch the escrow accepts now."""

    def __init__(self, ctx: SettlementContext) -> None:
        """Work through ``ctx``."""
        self.ctx = ctx
        self.simulations = 0

    def claims(self, book: DealBook, batch: Sequence[ReceiptRecord]) -> list[Claim]:
        """Return the claims of ``batch``: each receipt with its client-signed request."""
        out = []
        for record in batch:
            ack = book.acks[record.receipt.task_index]
            out.append(Claim(record.receipt, ack.request.max_price, ack.request_sig))
        return out

    def settleable(
        self, deal_id: int, book: DealBook, plan: Plan, batch: list[ReceiptRecord]
    ) -> list[ReceiptRecord]:
        """Return the tasks of ``batch`` whose claim simulates without a revert; set aside
        each task that reverts alone. Raise :class:`~contracts.errors.ChainError` when the
        chain cannot be asked."""
        while batch:
            failure = self.simulate(deal_id, book, plan, batch)
            if failure is None:
                return batch
            named = (
                failure.error_args.get("taskIndex") if isinstance(failure, ContractRevert) else None
            )
            indexes = [r.receipt.task_index for r in batch]
            if named is not None and int(str(named)) in indexes:
                self.ctx.set_aside(deal_id, int(str(named)), f"its claim reverts: {failure}")
                batch = [r for r in batch if r.receipt.task_index != int(str(named))]
                continue
            if len(batch) == 1:
                self.ctx.set_aside(deal_id, indexes[0], f"its claim reverts: {failure}")
                return []
            middle = len(batch) // 2
            left = self.settleable(deal_id, book, plan, batch[:middle])
            right = self.settleable(deal_id, book, plan, batch[middle:])
            if left and right and self.simulate(deal_id, book, plan, left + right) is not None:
                return left  # each half passes alone, not both together (the cap): claim one
            return left + right
        return []

    def simulate(
        self, deal_id: int, book: DealBook, plan: Plan, batch: Sequence[ReceiptRecord]
    ) -> Revert | None:
        """Run the batch's claim as a call from the provider; return its revert (None: none)."""
        escrow = self.ctx.escrow
        args = [c.as_args() for c in self.claims(book, batch)]
        call = escrow.contract.functions.claimReceipts(deal_id, plan.as_args(), args)
        self.simulations += 1
        try:
            call.call({"from": self.ctx.address}, block_identifier="pending")
        except Exception as exc:  # web3 raises many kinds: classified just below
            error: EscrowError = escrow.tx.revert_of(exc)
            if isinstance(error, ContractRevert | CallRevertedError):
                return error
            raise error from exc
        return None


__all__ = ["ClaimCheck"]
