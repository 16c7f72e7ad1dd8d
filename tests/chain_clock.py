"""The chain clock after a snapshot revert: never left behind the wall clock.

`evm_revert` puts the chain back to the snapshot's block, and anvil's clock with it: the next
block is stamped as if no time had passed since the snapshot. Reverting after every test would
then leave the chain further behind the host's clock with each test (by each test's length), and
a later test that takes a validity from the chain (`latest + 600`) and hands it to a process
that reads the host's clock (a market, a daemon) would find it already past on a slow host.

`resync` sets the clock back to now (never backwards) and mines one block, so the latest block's
timestamp, from which tests take every deadline and validity, is the present.
"""

from __future__ import annotations

import time

from contracts.chain import Anvil, rpc


def resync(anvil: Anvil) -> int:
    """Move `anvil`'s clock to max(host time, latest block + 1), mine a block; return its time."""
    now = max(int(time.time()), anvil.latest_timestamp() + 1)
    rpc(anvil.url, "evm_setTime", [now])
    rpc(anvil.url, "evm_mine")
    return anvil.latest_timestamp()


def revert(anvil: Anvil, snapshot_id: str) -> None:
    """Revert `anvil` to a snapshot, then `resync` its clock."""
    anvil.revert(snapshot_id)
    resync(anvil)
