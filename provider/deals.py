"""Deal lookups with a short per-deal cache, so the task hot path makes no web3 call.

A deal's parties, plan and expiry never change; its budget (``committed``, ``pending``) and
status do. Within the TTL (and, while a background re-read runs, up to ``max_stale_s``) the
daemon may accept a task against a budget the client just spent elsewhere (a breach refund)
or for a deal both parties just closed: the exposure is bounded by the tasks accepted in that
window, and the contract's cap check still stops any over-payment. Our own settlements
invalidate the entry at once.

What a stranger's made-up deal id costs (issue 22, item 4):

- **Nothing on the event loop.** The API awaits :meth:`DealCache.aget`, which answers from the
  cache or reads the chain in the cache's own small thread pool; the sync :meth:`DealCache.get`
  that the checks call then finds the answer cached.
- **A bounded number of reads.** At most ``max_reads`` chain reads run at once, and at most
  ``max_waiting`` lookups wait for one; beyond, a lookup is refused at once with
  ``chain_busy`` (503, ``Retry-After``). Lookups of the same id share one read.
- **No read for an id already found missing**: a not-found answer is kept for
  ``negative_ttl_s`` (default half the cache's TTL: 1 s) in a map bounded to ``max_negative``
  ids, oldest dropped first. Id 0 and ids of 2**64 or above are never read (the escrow numbers
  deals from 1).
- **No false "missing" for the next deals.** Deals are numbered in order, so a stranger could
  ask for the next ids every second to have a deal refused just after it opens. An id within
  :data:`FRONTIER_IDS` above the highest deal seen is answered from the negative map as
  ``deal_not_found_recently`` (503, ``Retry-After``: clients retry) rather than a final 404.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

from contracts.binding import DealState, Escrow
from contracts.errors import ChainError, ContractRevert
from contracts.messages import Plan
from contracts.reverts import EscrowDealNotFound
from provider.errors import RejectedError

MAX_DEAL_ID = 2**64
"""No deal id reaches this (the escrow counts deals from 1): larger ids are never read."""
MAX_NEGATIVE = 4096
MAX_READS = 4
FRONTIER_IDS = 1_024
"""Ids this far above the highest deal seen may be opened any moment (see the module doc)."""
MAX_WAITING = 64


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
        negative_ttl_s: float | None = None,
        max_negative: int = MAX_NEGATIVE,
        max_reads: int = MAX_READS,
        max_waiting: int = MAX_WAITING,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """Cache deals of ``escrow``; ``plans`` maps the plan hashes this provider quotes.

        ``max_stale_s`` (default ``5 * ttl_s``) bounds how old a state may be served while it
        is re-read in the background; ``negative_ttl_s`` (default ``ttl_s / 2``) how long a
        missing id is refused without a read; the other bounds are the module docstring's.
        """
        self._escrow = escrow
        self._plans = dict(plans)
        self._ttl_s = ttl_s
        self._clock = clock
        self._deals: dict[int, CachedDeal] = {}
        self._max_stale_s = 5 * ttl_s if max_stale_s is None else max_stale_s
        self._negative_ttl_s = ttl_s / 2 if negative_ttl_s is None else negative_ttl_s
        self._max_negative = max_negative
        self._missing: OrderedDict[int, float] = OrderedDict()  # id -> when found missing
        self._highest = 0  # the highest deal id read
        self._lock = threading.Lock()
        self._refreshing: set[int] = set()
        self._reading: dict[int, Future[DealState]] = {}  # one read per id at a time
        self._pool = ThreadPoolExecutor(max_reads, thread_name_prefix="deal-read")
        self._max_waiting = max_waiting
        self._waiting = 0
        self.reads = 0
        self.refused_busy = 0

    @property
    def escrow(self) -> Escrow:
        """Return the escrow the deals are read from."""
        return self._escrow

    def get(self, deal_id: int, *, fresh: bool = False) -> DealState:
        """Return the deal, read from the chain when not cached, stale, or ``fresh``.

        Between ``ttl_s`` and ``max_stale_s`` the cached state is returned while a background
        thread re-reads it (stale-while-revalidate), so no request waits on the RPC endpoint.
        An id found missing within ``negative_ttl_s`` is refused without a read.
        """
        if not fresh:
            cached = self._cached(deal_id)
            if cached is not None:
                return cached
        return self._read(deal_id)

    async def aget(self, deal_id: int) -> DealState:
        """Return the deal like :meth:`get`, never reading the chain on the event loop.

        A lookup the cache cannot answer waits for a read in the cache's pool (shared with
        every other lookup of the id); ``chain_busy`` when ``max_waiting`` already wait.
        """
        cached = self._cached(deal_id)
        if cached is not None:
            return cached
        with self._lock:
            if self._waiting >= self._max_waiting:
                self.refused_busy += 1
                raise RejectedError(
                    "chain_busy", f"{self._waiting} deal lookups wait for the chain; retry"
                )
            self._waiting += 1
            future = self._reading.get(deal_id)
            if future is None:
                future = self._pool.submit(self._read_once, deal_id)
                self._reading[deal_id] = future
        try:
            return await asyncio.wrap_future(future)
        finally:
            with self._lock:
                self._waiting -= 1

    def _read_once(self, deal_id: int) -> DealState:
        try:
            return self._read(deal_id)
        finally:
            with self._lock:
                self._reading.pop(deal_id, None)

    def _cached(self, deal_id: int) -> DealState | None:
        """Return the cached state (starting a re-read when stale); raise if known missing."""
        if not 0 < deal_id < MAX_DEAL_ID:
            raise RejectedError("deal_not_found", f"deal {deal_id} does not exist")
        cached = self._deals.get(deal_id)
        if cached is not None:
            age = self._clock() - cached.read_at
            if age < self._ttl_s:
                return cached.state
            if age < self._max_stale_s:
                self._refresh_in_background(deal_id)
                return cached.state
            return None
        missing_at = self._missing.get(deal_id)
        if missing_at is not None and self._clock() - missing_at < self._negative_ttl_s:
            if deal_id <= self._highest + FRONTIER_IDS:
                raise RejectedError(
                    "deal_not_found_recently",
                    f"deal {deal_id} did not exist {self._negative_ttl_s:g} s ago; retry",
                )
            raise RejectedError("deal_not_found", f"deal {deal_id} does not exist")
        return None

    def _read(self, deal_id: int) -> DealState:
        if not 0 < deal_id < MAX_DEAL_ID:
            raise RejectedError("deal_not_found", f"deal {deal_id} does not exist")
        try:
            state = self._escrow.get_deal(deal_id)
        except EscrowDealNotFound as exc:
            with self._lock:
                self.reads += 1
                self._missing[deal_id] = self._clock()
                self._missing.move_to_end(deal_id)
                while len(self._missing) > self._max_negative:
                    self._missing.popitem(last=False)
            raise RejectedError("deal_not_found", f"deal {deal_id} does not exist") from exc
        except (ChainError, ContractRevert) as exc:
            reason = f"cannot read deal {deal_id}: {exc}"
            raise RejectedError("chain_unavailable", reason) from exc
        with self._lock:
            self.reads += 1
            self._deals[deal_id] = CachedDeal(state, self._clock())
            self._missing.pop(deal_id, None)
            self._highest = max(self._highest, deal_id)
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

    def close(self) -> None:
        """Stop the read pool (reads in flight finish)."""
        self._pool.shutdown(wait=False, cancel_futures=True)
