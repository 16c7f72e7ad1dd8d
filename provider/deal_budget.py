"""A deal's budget as the task and voucher intake see it: what its cap keeps free.

The checks here run under the task service's lock (with the journal's, for vouchers): an ack
and a voucher are each checked against the cap with the other in place.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from contracts.binding import DealState
from contracts.messages import TaskRequest, Voucher
from provider.deals import DealCache
from provider.errors import ProviderError, RejectedError
from provider.journal import DealBook, Journal
from provider.receipts import cap_spent, voucher_reserve

# The task service's logger: its lines and the filters on them stay as they were.
log = logging.getLogger("provider.service")


class DealBudget:
    """Judge whether a deal's cap and the chain's view of its funds can pay one more task."""

    def __init__(
        self,
        *,
        journal: Journal,
        deals: DealCache,
        reject: Callable[[str, str], RejectedError],
        refresh_settled: Callable[[int], None] | None = None,
    ) -> None:
        """Read deals from ``journal`` and ``deals``; ``reject(code, reason)`` makes a
        refusal; ``refresh_settled(deal)`` reads the chain's settlement of a deal's overdue
        tasks before a budget refusal."""
        self.journal = journal
        self.deals = deals
        self._reject = reject
        self._refresh_settled = refresh_settled
        # deal -> ((settlement rows, voucher rows), spent + voucher reserve): see cap_free
        self._cap_cache: dict[int, tuple[tuple[int, int], int]] = {}

    def short(self, request: TaskRequest, deal: DealState, price: int, *, final: bool) -> bool:
        """Return whether the deal's budget may be short only for refunds the journal has not
        seen (worth a :meth:`refresh`); raise ``insufficient_budget`` when it is short for sure
        (hold the task service's lock)."""
        book = self.journal.deal(request.deal_id)
        unpaid = 0 if book is None else book.unpaid_ack_total()
        # The cap must keep every acked task payable, a tip of the latest voucher counted
        # (provider.receipts.cap_free): the journal's view, which a refresh cannot change.
        free = self.cap_free(request.deal_id, book, deal)
        if free < price:
            raise self._reject(
                "insufficient_budget",
                f"deal {request.deal_id} keeps {max(free, 0)} of its cap {deal.max_spend} free "
                f"once its acked tasks and vouchers are set aside; this task needs {price}",
            )
        available = deal.max_spend - deal.committed - deal.pending
        if available >= request.max_price and available - unpaid >= price:
            return False
        if (
            final
            or book is None
            or self._refresh_settled is None
            or (available < request.max_price)
        ):
            raise self._reject(
                "insufficient_budget",
                f"deal {request.deal_id} has {available} left with {unpaid} acked but "
                f"unpaid; this task needs {price} (maxPrice {request.max_price})",
            )
        return True

    def cap_free(
        self,
        deal_id: int,
        book: DealBook | None,
        deal: DealState,
        voucher: Voucher | None = None,
    ) -> int:
        """Return what the deal's cap keeps free once every acked task not settled, what the
        chain spent and the tip of ``voucher`` (by default the latest accepted one) are set
        aside (:func:`provider.receipts.cap_free`). Cached per deal until a settlement or a
        voucher is journaled, so the task path stays O(1)."""
        if book is None:
            return deal.max_spend - self.reservation_fee(deal)
        if voucher is not None:
            held = cap_spent(book, self.reservation_fee(deal)) + voucher_reserve(book, voucher)
        else:
            key = (len(book.settlements), len(book.vouchers))
            cached = self._cap_cache.get(deal_id)
            if cached is not None and cached[0] == key:
                held = cached[1]
            else:
                latest = book.latest_voucher
                held = cap_spent(book, self.reservation_fee(deal)) + voucher_reserve(
                    book, None if latest is None else latest.voucher
                )
                self._cap_cache[deal_id] = (key, held)
        return deal.max_spend - held - book.unpaid_ack_total()

    def reservation_fee(self, deal: DealState) -> int:
        """Return the fee the deal's opening took from its cap (its committed amount then)."""
        plan = self.deals.plan_of(deal)
        return deal.committed if plan is None else plan.reservation_fee

    def refresh(self, deal_id: int) -> None:
        """Read the chain's state of a deal's tasks past their settlement instant (outside the
        task service's lock)."""
        if self._refresh_settled is None:
            return
        try:
            self._refresh_settled(deal_id)
        except ProviderError as exc:
            log.warning("cannot refresh settled tasks", extra={"deal": deal_id, "error": str(exc)})


__all__ = ["DealBudget"]
