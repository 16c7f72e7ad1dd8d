"""Chain faults for ``scripts/soak --reorgs``: reorgs and dropped transactions on a real anvil.

While the soak's workload and its settlement run, one thread replaces the last 1-``MAX_DEPTH``
blocks with empty ones (``anvil_reorg``: every transaction in them is gone from the chain), and
another drops pending transactions from the node's pool (``anvil_dropTransaction``): each
transaction seen entering the pool (a resent one again) is dropped with probability
``drop_share``, so any one send may be lost, and none is lost for good. (A node that drops every
transaction it gets would be censoring, which no sender survives: an earlier version of this
harness did that in quiet periods, when its timer had run out and the first transaction to
arrive was the only candidate.) Each dropped transaction is remembered by sender and nonce:
it counts as resent once the chain holds a transaction of that sender at that nonce (the same
bytes sent again, or a replacement).
"""

from __future__ import annotations

import random
import threading
from dataclasses import dataclass, field

from contracts.chain import rpc

MAX_DEPTH = 5
"""The deepest reorg injected; processes count a transaction done one block deeper."""


@dataclass
class ChainFaults:
    """Inject reorgs and dropped transactions until `stop`."""

    url: str
    seed: int
    reorg_every_s: float = 12.0
    drop_share: float = 0.25
    reorgs: int = 0
    depths: list[int] = field(default_factory=list)
    dropped: list[tuple[str, int]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _threads: list[threading.Thread] = field(default_factory=list)

    def start(self) -> None:
        rng = random.Random(self.seed)
        for target in (self._reorg_loop, self._drop_loop):
            thread = threading.Thread(target=target, args=(random.Random(rng.random()),))
            thread.daemon = True
            thread.start()
            self._threads.append(thread)

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join()

    def _reorg_loop(self, rng: random.Random) -> None:
        while not self._stop.wait(rng.uniform(0.5, 1.5) * self.reorg_every_s):
            depth = rng.randint(1, MAX_DEPTH)
            try:
                rpc(self.url, "anvil_reorg", [depth, []])
            except Exception as exc:  # reported in the figures, never fatal to the run
                self.errors.append(f"reorg {depth}: {exc}")
                continue
            self.reorgs += 1
            self.depths.append(depth)

    def _drop_loop(self, rng: random.Random) -> None:
        pooled: set[str] = set()  # the hashes pending at the previous look
        while not self._stop.wait(0.05):
            try:
                pending = rpc(self.url, "txpool_content")["pending"]
            except Exception as exc:
                self.errors.append(f"drop: {exc}")
                continue
            now = {tx["hash"]: tx for by_nonce in pending.values() for tx in by_nonce.values()}
            arrived = [tx for h, tx in now.items() if h not in pooled]
            pooled = set(now)
            for tx in arrived:
                if rng.random() >= self.drop_share:
                    continue
                try:
                    rpc(self.url, "anvil_dropTransaction", [tx["hash"]])
                except Exception as exc:
                    self.errors.append(f"drop: {exc}")
                    continue
                pooled.discard(tx["hash"])  # sent again, it arrives again
                self.dropped.append((tx["from"], int(tx["nonce"], 16)))

    def resent(self) -> int:
        """Return how many dropped transactions' (sender, nonce) the chain now holds."""
        count = 0
        for sender, nonce in self.dropped:
            mined = int(rpc(self.url, "eth_getTransactionCount", [sender, "latest"]), 16)
            count += mined > nonce
        return count

    def figures(self) -> dict[str, object]:
        return {
            "reorgs_injected": self.reorgs,
            "reorg_depths": sorted(self.depths),
            "txs_dropped": len(self.dropped),
            "txs_dropped_resent": self.resent(),
            "chain_fault_errors": self.errors[:5],
        }
