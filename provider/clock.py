"""The daemon's clock: the host's clock, never behind the chain's.

Deadlines, expiries and settlement instants are judged by the chain (``block.timestamp``).
A host clock that runs behind the chain would make the daemon accept deadlines that are
already short and settle late, so the daemon's time is ``time.time()`` plus the largest lead
of the chain's clock it has seen (zero when the chain is behind, as it normally is by a block
or so). Reading the chain (:meth:`ChainClock.chain_now`) updates that lead; the task hot path
only calls :meth:`ChainClock.now`, which makes no RPC call.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable


class ChainClock:
    """Wall-clock seconds, moved forward to the chain's clock when the chain is ahead."""

    def __init__(
        self, latest_block_time: Callable[[], int], wall: Callable[[], float] = time.time
    ) -> None:
        """Read the chain through ``latest_block_time`` (the latest block's timestamp)."""
        self._latest_block_time = latest_block_time
        self._wall = wall
        self._lead = 0.0
        self._lock = threading.Lock()

    def now(self) -> float:
        """Return the daemon's time: the host's clock plus the chain's largest lead seen."""
        return self._wall() + self._lead

    def chain_now(self) -> int:
        """Return the latest block's timestamp (one RPC call) and update the chain's lead."""
        stamp = int(self._latest_block_time())
        self.observe(stamp)
        return stamp

    def observe(self, block_time: int) -> None:
        """Take note of a block timestamp (the chain is at least there now)."""
        lead = block_time - self._wall()
        with self._lock:
            if lead > self._lead:
                self._lead = lead

    @property
    def lead_s(self) -> float:
        """Return how far ahead of the host's clock the chain was seen, in seconds (>= 0)."""
        return self._lead
