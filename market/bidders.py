"""The bids the order book shows: those whose owners' free escrow balance can pay for them.

A wallet can withdraw after its bid rests. Matching is safe against that (the match gate reads
the balance afresh, `market.funds`), but a book that keeps showing such bids shows a price no
one can trade at. So a market with a match gate shows a bid only if its owner's last free
balance read covers one unit of the owner's lowest live bid and `min_balance_per_order` for
each of its live orders (an owner never read is shown).

Those figures are refreshed by the indexed escrow events plus a backstop pass. After each run
of the chain indexer (`market.indexer`), the balance of each owner of live bids that the run's
events moved is read again (`FundsGuard.reread`, one read per owner whatever the events; owners
of nothing live are not read): a withdrawal hides its owner's bids and a deposit shows them
again, and matches them, one indexer run later. The backstop, for anything the events miss,
reads the balances of the owners of live bids again in turn, `BIDDERS_PER_PASS` per pass
(`PayingBidders.refresh`). Display only: matching never trusts these figures.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager

from sqlmodel import Session

from market import levels as levels_sql
from market.errors import ChainUnavailableError
from market.funds import FundsGuard

BIDDERS_PER_PASS = 200
"""Bid owners whose balance `PayingBidders.refresh` reads per pass (chain reads)."""


class PayingBidders:
    """Which owners of live bids can pay for them, by the balances last read (see the module)."""

    def __init__(
        self,
        funds: FundsGuard,
        *,
        session: Callable[[], AbstractContextManager[Session]],
        now: Callable[[], int],
        changed: Callable[[], None],
    ) -> None:
        """Read balances through `funds`; call `changed` when a pass changed one."""
        self._funds = funds
        self._session = session
        self._now = now
        self._changed = changed
        self._cursor = 0  # where `refresh` goes on from

    def owners(self, session: Session, device_class: str, now: int) -> set[str]:
        """Return the owners of live bids in `device_class` whose last free balance read
        covers one unit of their lowest bid and `min_balance_per_order` for each of their live
        orders (unread: shown)."""
        cached = self._funds.balances.cached
        per_order = self._funds.min_balance_per_order
        figures = self._funds.commitments.figures
        return {
            owner
            for owner, price in levels_sql.bid_owners(
                session=session, now=now, device_class=device_class
            )
            if (balance := cached(owner)) is None
            or (balance >= price and balance >= per_order * figures(owner, now).live)
        }

    def refresh(self, limit: int = BIDDERS_PER_PASS) -> int:
        """Read afresh the free balances of up to `limit` owners of live bids, in turn; return
        how many were read."""
        owners = self._funds.commitments.bidders()  # in memory: no scan of the book
        if not owners:
            return 0
        start = self._cursor % len(owners)
        turn = (owners[start:] + owners[:start])[:limit]
        self._cursor = start + len(turn)
        changed = False
        for owner in turn:
            before = self._funds.balances.cached(owner)
            try:
                changed |= self._funds.balances.read(owner) != before
            except ChainUnavailableError:
                break
        if changed:
            self._changed()
        return len(turn)
