"""The settle-by rule, the one Python copy of the escrow's ``_settleBy``.

A task's settlement instant: until it (inclusive) the provider may claim the task, after it the
client may refund it. The task's deadline counts at most up to the deal's expiry, then the deal's
challenge window follows. ``contracts/sol/ComputeEscrow.sol`` computes the same in Solidity;
``tests/contracts/test_settle_by_parity.py`` checks the two agree on the deployed contract.
The daemon (:mod:`provider.receipts`) and the SDK (:mod:`client.tasks`) use this function.
"""

from __future__ import annotations


def settle_by(deadline: int, expiry: int, challenge_window: int) -> int:
    """Return a task's settlement instant: claimable until it, refundable only after it."""
    return min(deadline, expiry) + challenge_window


__all__ = ["settle_by"]
