"""The finalize job: collect claimed batches once their challenge window has passed.

A dispute the arbiter left past its period is lapsed (the client wins it), so the deal can
close.
"""

from __future__ import annotations

import logging
from collections.abc import Collection

from contracts.binding import BatchStatus
from contracts.errors import ChainError, ContractRevert
from provider.journal import SettlementRecord
from provider.lifecycle import SettlementAction, SettlementEvent, SettlementStep
from provider.settlement.context import SettlementContext

log = logging.getLogger("provider.settlement")


class ClaimFinalization:
    """Finalize claimed batches whose window passed; lapse disputes left past their period."""

    def __init__(self, ctx: SettlementContext) -> None:
        """Work through ``ctx``."""
        self.ctx = ctx
        self._disputed: set[tuple[int, int]] = set()  # (deal, batch) disputes logged

    def finalize_claims(self, deals: Collection[int] | None = None) -> list[SettlementRecord]:
        """Finalize every claimed batch whose challenge window has passed; lapse disputes the
        arbiter left past its period (the client wins them: recorded ``rejected``)."""
        done = []
        with self.ctx.lock:
            chain_now = max(self.ctx.clock.chain_now(), int(self.ctx.clock.now()) - 1)
            for deal_id, book in self.ctx.books(deals):
                ended = {
                    int(s.data["batch_id"])
                    for s in book.settlements
                    if s.action in (SettlementAction.FINALIZE, SettlementAction.REJECTED)
                }
                for claim in [s for s in book.settlements if s.action == SettlementAction.CLAIM]:
                    batch_id = int(claim.data["batch_id"])
                    if batch_id in ended or chain_now < int(claim.data["deadline"]):
                        continue
                    record = self._finalize(deal_id, batch_id, claim, chain_now)
                    if record is not None:
                        done.append(record)
        return done

    def _finalize(
        self, deal_id: int, batch_id: int, claim: SettlementRecord, chain_now: int
    ) -> SettlementRecord | None:
        try:
            tx = self.ctx.escrow.finalize_claim(self.ctx.private_key, deal_id, batch_id)
            action, tx_hash = SettlementAction.FINALIZE, tx.tx_hash
        except (ContractRevert, ChainError) as exc:
            try:
                batch = self.ctx.escrow.get_batch(deal_id, batch_id)
            except (ContractRevert, ChainError):
                self.ctx.failed(SettlementStep.FINALIZE, deal_id, exc)
                return None
            if batch.status == BatchStatus.PAID:
                action, tx_hash = SettlementAction.FINALIZE, None
            elif batch.status == BatchStatus.REJECTED:
                action, tx_hash = SettlementAction.REJECTED, None
            elif batch.status == BatchStatus.DISPUTED and chain_now >= batch.deadline:
                try:
                    tx_hash = self.ctx.escrow.lapse_dispute(
                        self.ctx.private_key, deal_id, batch_id
                    ).tx_hash
                except (ContractRevert, ChainError) as lapse:
                    self.ctx.failed(SettlementStep.LAPSE, deal_id, lapse)
                    return None
                action = SettlementAction.REJECTED
            else:  # disputed: the arbiter rules; try again later
                if batch.status != BatchStatus.DISPUTED:
                    self.ctx.failed(SettlementStep.FINALIZE, deal_id, exc)
                elif (deal_id, batch_id) not in self._disputed:
                    self._disputed.add((deal_id, batch_id))
                    self.ctx.metrics.money(SettlementEvent.DISPUTED, {})
                    log.warning(
                        "claim disputed by the client: the arbiter rules by the deadline",
                        extra={
                            "deal": deal_id,
                            "batch": batch_id,
                            "amount": int(claim.data["amount"]),
                            "arbitration_deadline": batch.deadline,
                        },
                    )
                return None
        finished = self.ctx.record(
            deal_id, action, {"batch_id": batch_id, "amount": claim.data["amount"]}, tx_hash
        )
        if action == SettlementAction.FINALIZE:
            log.info(
                "claim finalized: paid",
                extra={
                    "deal": deal_id,
                    "batch": batch_id,
                    "paid": int(claim.data["amount"]),
                    "tx": tx_hash,
                },
            )
        else:
            log.warning(
                "claim rejected: the dispute went to the client",
                extra={"deal": deal_id, "batch": batch_id, "lost": int(claim.data["amount"])},
            )
        return finished
