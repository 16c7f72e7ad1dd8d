"""The chain as seen by market processes that share one PostgreSQL database and one escrow
(`market.partition`): one of them indexes, the others follow its index and take over when it
stops.

Only the process holding the indexer lock indexes the escrow (`market.indexer`). Each other
process runs `ChainFollow` on the same schedule instead: it reads which accounts the events the
indexer stored since its last run moved (up to the block the index has reached,
`chain_index.moved_since`), and reads those figures again if they matter to it
(`FundsGuard.reread`), so a withdrawal or an unstake indexed by one process reaches the others
one run later. A follower starts from the index as it stands (what happened before, it reads
afresh when it needs a figure). If the index went back (the indexer rebuilt it after a reorg),
the follower forgets every kept figure and follows from there.

The lock lives with the indexing process's database connection: when that process exits or is
killed, its lock is free at once, and the next run of a follower takes it (`Partition.try_index`)
and indexes from where the index stands; from then on that process keeps its figures until an
indexed event moves them, as an indexer does.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable

from market import chain_index
from market.errors import ChainUnavailableError
from market.indexer import Indexer
from market.service import MarketService

log = logging.getLogger(__name__)


class Follower:
    """Read again the figures the indexed events of another process moved (see the module)."""

    def __init__(self, service: MarketService, name: str) -> None:
        """Follow the index named `name` (the indexer's name for the escrow)."""
        self.service = service
        self.name = name
        self.block: int | None = None  # the index's block this process has followed up to
        self._unread: set[str] = set()

    def run_once(self) -> int:
        """Follow the index to where it stands; return how many accounts were read again."""
        with self.service.session() as session:
            block = chain_index.indexed_block(session=session, name=self.name)
            if block is None or self.block is None or block < self.block:
                if self.block is not None and (block is None or block < self.block):
                    self._forget()  # the index was rebuilt: nothing kept is known exact
                self.block = block
                return 0
            if block == self.block and not self._unread:
                return 0
            self._unread |= chain_index.moved_since(session=session, after=self.block, upto=block)
        self.block = block
        return self._reread()

    def _reread(self) -> int:
        if not self._unread or not self.service.guards_funds():
            self._unread.clear()
            return 0
        try:
            reread = self.service.funds.reread(self._unread, self.service.now())
        except ChainUnavailableError:
            return 0
        if reread.done:
            self._unread.clear()
        if reread.changed:
            self.service.changed()
        if reread.raised:
            self.service.rematch()
        return reread.reads

    def _forget(self) -> None:
        funds = self.service.funds
        for cache in (funds.balances, funds.stakes):
            cache.clear()
        self._unread.clear()


class ChainFollow:
    """The chain job of a process of a shared database: index while it holds the indexer lock;
    else follow the index and try to take the lock (see the module)."""

    def __init__(self, service: MarketService, make_indexer: Callable[[], Indexer]) -> None:
        """Make the indexer with `make_indexer` (its name is the index to follow)."""
        self.service = service
        self.indexer = make_indexer()
        self.follower = Follower(service, self.indexer.name)
        self.took_over = 0  # times this process took the indexer lock from none

    @property
    def last_error(self) -> str | None:
        """The indexer's last error while this process indexes."""
        return self.indexer.last_error if self.service.partition.indexes else None

    def run_once(self) -> int:
        """Index (holding the lock) or follow; return what the run did (events or reads)."""
        partition = self.service.partition
        if not partition.indexes and partition.try_index():
            self.took_over += 1
            log.warning("indexer: this process now indexes the chain (the indexer lock was free)")
            funds = self.service.funds
            for cache in (funds.balances, funds.stakes):
                cache.ttl = math.inf  # kept until an indexed event moves them, as an indexer
        if partition.indexes:
            return self.indexer.run_once()
        return self.follower.run_once()
