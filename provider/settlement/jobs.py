"""The settlement jobs wired together: one object the daemon starts, stops and calls.

:class:`SettlementJobs` owns one :class:`~provider.settlement.context.SettlementContext` and
one instance of each job; its methods are the jobs' own, callable directly (tests trigger them
after moving the chain's clock), and :meth:`SettlementJobs.run_all` runs them all in order.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass

from contracts.binding import DealState, Escrow
from contracts.errors import ChainError
from provider.clock import ChainClock
from provider.config import SettlementConfig
from provider.deals import DealCache
from provider.journal import DealBook, Journal, SettlementRecord
from provider.lifecycle import SettlementStep
from provider.metrics import ProviderMetrics
from provider.settlement.claim import ReceiptClaims
from provider.settlement.close import DealClosing
from provider.settlement.context import SettlementContext
from provider.settlement.discovery import DealDiscovery
from provider.settlement.finalize import ClaimFinalization
from provider.settlement.redeem import VoucherRedemption
from provider.settlement.schedule import SettlementSchedule
from provider.settlement.watch import DealWatch


@dataclass(frozen=True, slots=True)
class JobReport:
    """What one pass of the jobs did."""

    redeemed: tuple[SettlementRecord, ...] = ()
    claimed: tuple[SettlementRecord, ...] = ()
    finalized: tuple[SettlementRecord, ...] = ()
    closed: tuple[int, ...] = ()
    discovered: tuple[int, ...] = ()


class SettlementJobs:
    """The provider's on-chain settlement, driven by the journal and each deal's windows."""

    def __init__(
        self,
        *,
        private_key: str,
        escrow: Escrow,
        journal: Journal,
        deals: DealCache,
        config: SettlementConfig,
        metrics: ProviderMetrics,
        clock: ChainClock | None = None,
    ) -> None:
        """Wire the jobs; ``clock`` is the daemon's (by default, one reading this chain)."""
        self.ctx = ctx = SettlementContext(
            private_key=private_key,
            escrow=escrow,
            journal=journal,
            deals=deals,
            config=config,
            metrics=metrics,
            clock=clock,
        )
        self.address = ctx.address
        self.escrow = escrow
        self.journal = journal
        self.deals = deals
        self.config = config
        self.metrics = metrics
        self.clock = ctx.clock
        self.discovery = DealDiscovery(ctx)
        self.watch = DealWatch(ctx)
        self.redemption = VoucherRedemption(ctx)
        self.claims = ReceiptClaims(ctx)
        self.finalization = ClaimFinalization(ctx)
        self.closing = DealClosing(
            ctx, redemption=self.redemption, claims=self.claims, finalization=self.finalization
        )
        self.schedule = SettlementSchedule(ctx, lambda: self.run_all())

    # ---- timing ------------------------------------------------------------------------

    def settle_by_of(self, book: DealBook, index: int, state: DealState) -> int | None:
        """Return a task's settlement instant (None for a task the journal has no ack of)."""
        return self.ctx.settle_by_of(book, index, state)

    def act_by(self, settle: int, state: DealState) -> float:
        """Return when the jobs put a task settling at ``settle`` on chain at the latest."""
        return self.ctx.act_by(settle, state)

    # ---- the jobs ----------------------------------------------------------------------

    def discover_deals(self) -> list[int]:
        """Journal every deal opened with this provider since the last scan; return them."""
        return self.discovery.discover_deals()

    def window_problems(self) -> list[str]:
        """Return why this config cannot settle some deal it still has to settle (empty: none)."""
        return self.discovery.window_problems()

    def watch_deals(self, deals: Collection[int] | None = None) -> list[int]:
        """Journal lost claims and refunds of overdue tasks; record closed deals; return those."""
        return self.watch.watch_deals(deals)

    def sync_overdue(self, deal_id: int) -> None:
        """Journal refunds of a deal's tasks past their settlement instant (no job lock)."""
        self.watch.sync_overdue(deal_id)

    def reconcile_claims(self) -> list[SettlementRecord]:
        """Journal every claim batch the chain holds and the journal lacks (run at start)."""
        return self.watch.reconcile_claims()

    def redeem_due(
        self, *, force: bool = False, deals: Collection[int] | None = None
    ) -> list[SettlementRecord]:
        """Redeem each deal's latest acceptable voucher where it is due (``force``: any rise)."""
        return self.redemption.redeem_due(force=force, deals=deals)

    def claim_due(
        self, *, force: bool = False, deals: Collection[int] | None = None
    ) -> list[SettlementRecord]:
        """Claim delivered, on-time tasks no acceptable voucher covers, once they are due."""
        return self.claims.claim_due(force=force, deals=deals)

    def settle_due(self, *, force: bool = False, deals: Collection[int] | None = None) -> JobReport:
        """Redeem, then claim what is due (see :meth:`redeem_due` and :meth:`claim_due`)."""
        redeemed = self.redeem_due(force=force, deals=deals)
        return JobReport(
            redeemed=tuple(redeemed), claimed=tuple(self.claim_due(force=force, deals=deals))
        )

    def finalize_claims(self, deals: Collection[int] | None = None) -> list[SettlementRecord]:
        """Finalize every claimed batch whose challenge window has passed; lapse disputes."""
        return self.finalization.finalize_claims(deals)

    def close_deals(self, deals: Collection[int] | None = None) -> list[int]:
        """Close deals the client agreed to close, and deals past expiry + 2 windows."""
        return self.closing.close_deals(deals)

    def run_all(self, deals: Collection[int] | None = None) -> JobReport:
        """Run every job once, in order: discover, watch, redeem, claim, finalize, close.

        ``deals`` limits every job but the discovery to those deals.
        """
        with self.ctx.lock:
            try:
                discovered = self.discover_deals()
            except (ChainError, ValueError) as exc:
                self.ctx.failed(SettlementStep.DISCOVER, 0, exc)
                discovered = []
            closed = self.watch_deals(deals)
            settled = self.settle_due(deals=deals)
            finalized = self.finalize_claims(deals)
            return JobReport(
                redeemed=settled.redeemed,
                claimed=settled.claimed,
                finalized=tuple(finalized),
                closed=(*closed, *self.close_deals(deals)),
                discovered=tuple(discovered),
            )

    # ---- scheduling --------------------------------------------------------------------

    def start(self, extra: Sequence[tuple[Callable[[], object], float]] = ()) -> None:
        """Run :meth:`run_all` every ``interval_s``, the first pass at once (plus ``extra``)."""
        self.schedule.start(extra)

    def stop(self) -> None:
        """Stop the scheduler (jobs in progress finish)."""
        self.schedule.stop()
