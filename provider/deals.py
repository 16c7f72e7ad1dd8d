"""Deal lookups with a short per-deal cache, so the task hot path makes no web3 call.

A deal's parties, plan and expiry never change; its budget (``committed``, ``pending``) and
status do. Within the TTL (and, while a background re-read runs, up to ``max_stale_s``) the
daemon may accept a task against a budget the client just spent elsewhere (a breach refund)
or for a deal both parties just closed: the exposure is bounded by the tasks accepted in that
window, and the contract's cap check still stops any over-payment. Our own settlements
invalidate the entry at once.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from contracts.binding import DealState, Escrow
from contracts.errors import ChainError, ContractRevert
from contracts.messages import Plan
from contracts.reverts import EscrowDealNotFound
from provider.errors import RejectedError


@dataclass(frozen=True, slots=True)
class CachedDeal:
    """A deal as last read from the chain, and when."""

    state: DealState
    read_at: float


class DealCache:
    """Read deals through the escrow, caching each for ``ttl_s`` seconds."""

    def __init__(
        self,
        escrow: Escrow,
        plans: dict[bytes, Plan],
        *,
        ttl_s: float = 2.0,
        max_stale_s: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """Cache deals of ``escrow``; ``plans`` maps the plan hashes this provider quotes.

        ``max_stale_s`` (default ``5 * ttl_s``) bounds how old a state may be served while it
        is re-read in the background.
        """
        self._escrow = escrow
        self._plans = dict(plans)
        self._ttl_s = ttl_s
        self._clock = clock
        self._deals: dict[int, CachedDeal] = {}
        self._max_stale_s = 5 * ttl_s if max_stale_s is None else max_stale_s
        self._lock = threading.Lock()
        self._refreshing: set[int] = set()
        self.reads = 0

    @property
    def escrow(self) -> Escrow:
        """Return the escrow the deals are read from."""
        return self._escrow

    def get(self, deal_id: int, *, fresh: bool = False) -> DealState:
        """Return the deal, read from the chain when not cached, stale, or ``fresh``.

        Between ``ttl_s`` and ``max_stale_s`` the cached state is returned while a background
        thread re-reads it (stale-while-revalidate), so no request waits on the RPC endpoint.
        """
        cached = self._deals.get(deal_id)
        if not fresh and cached is not None:
            age = self._clock() - cached.read_at
            if age < self._ttl_s:
                return cached.state
            if age < self._max_stale_s:
                self._refresh_in_background(deal_id)
                return cached.state
        return self._read(deal_id)

    def _read(self, deal_id: int) -> DealState:
        try:
            state = self._escrow.get_deal(deal_id)
        except EscrowDealNotFound as exc:
            raise RejectedError("deal_not_found", f"deal {deal_id} does not exist") from exc
        except (ChainError, ContractRevert) as exc:
            reason = f"cannot read deal {deal_id}: {exc}"
            raise RejectedError("chain_unavailable", reason) from exc
        with self._lock:
            self.reads += 1
            self._deals[deal_id] = CachedDeal(state, self._clock())
        return state

    def _refresh_in_background(self, deal_id: int) -> None:
        with self._lock:
            if deal_id in self._refreshing:
                return
            self._refreshing.add(deal_id)
        threading.Thread(target=self._refresh, args=(deal_id,), daemon=True).start()

    def _refresh(self, deal_id: int) -> None:
        try:
            self._read(deal_id)
        except RejectedError:
            self._deals.pop(deal_id, None)  # the next request reads (and reports) it
        finally:
            with self._lock:
                self._refreshing.discard(deal_id)

    def invalidate(self, deal_id: int) -> None:
        """Forget a deal, so the next lookup reads the chain (after we settle on it)."""
        self._deals.pop(deal_id, None)

    def plan_of(self, state: DealState) -> Plan | None:
        """Return the plan a deal was opened with, if it is one of ours."""
        return self._plans.get(state.plan_hash)
