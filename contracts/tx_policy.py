"""How a role sends its transactions on a real chain: fees, replacement and confirmations.

One :class:`TxPolicy` per role (provider, client, arbiter, deployer), passed to the
transactor:

- **Fees** (EIP-1559): the tip is the median of the last blocks' 50th-percentile rewards
  (``eth_feeHistory``; the node's ``eth_maxPriorityFeePerGas`` where it has no history), the
  fee cap twice the pending base fee plus the tip, and both never above ``max_fee_wei``: a base
  fee above the cap is :class:`FeeCapError` (the transaction is not sent) rather than a
  payment the operator did not allow.
- **Replacement**: a transaction not mined ``replace_after_blocks`` blocks after it was sent is
  signed again with the same nonce and fees raised by ``REPLACEMENT_BUMP`` (nodes accept a
  replacement only 10% above), up to the cap; a transaction the node no longer knows (dropped
  from its pool, or reorged out) is sent again. The first of the sent versions to be mined is
  the result: one nonce, one effect.
- **Confirmations**: a receipt counts once ``confirmations`` blocks hold it (1: the block that
  mined it) and its block is still the chain's block at that height; a receipt whose block was
  replaced by a reorg is waited for again.
- **Definite ends**: a wait ends mined (with its confirmations), or with
  :class:`NonceTakenError` once another transaction of the sender holds the nonce with the
  confirmations (none of the versions can be mined any more), or with
  :class:`TransactionRefusedError` when the node forgot every version and refuses to take it
  again (funds, gas, a base fee above the cap). After either error no version is held or sent
  again: the intended action was not done and may be sent anew.
"""

from __future__ import annotations

from dataclasses import dataclass
from statistics import median

from contracts.errors import ChainError, FeeTooLowError

REPLACEMENT_BUMP = 1.125
"""A replacement's fee cap and tip over the replaced one's (nodes require at least 10%)."""
FEE_HISTORY_BLOCKS = 5
"""Blocks of ``eth_feeHistory`` the tip is taken from."""


class FeeCapError(ChainError):
    """The chain's base fee is above the fee cap the role allows: nothing was sent."""


class NonceTakenError(ChainError):
    """Another transaction of the sender (of this process or another) was mined with the
    confirmations at the nonce of the one waited for: no version of it can be mined."""


class TransactionRefusedError(ChainError):
    """The node forgot every version of a sent transaction and refuses to take it again: it is
    in no pool this process knows, and nothing of it is sent again."""


class ReplacementUnderpricedError(FeeTooLowError):
    """The node holds another transaction of the sender at this nonce, at fees this one does
    not raise enough to replace it."""


class KnownTransactionError(ChainError):
    """The node already holds this very transaction (the same signed bytes)."""


@dataclass(frozen=True)
class TxPolicy:
    """A role's rules for sending (the module docstring says what each does)."""

    confirmations: int = 1
    replace_after_blocks: int = 3
    max_fee_wei: int | None = None

    def __post_init__(self) -> None:
        if self.confirmations < 1:
            raise ValueError("confirmations must be at least 1 (the block that mines it)")
        if self.replace_after_blocks < 1:
            raise ValueError("replace_after_blocks must be at least 1")
        if self.max_fee_wei is not None and self.max_fee_wei < 1:
            raise ValueError("max_fee_wei must be positive (or unset: no cap)")

    @classmethod
    def from_settings(
        cls, confirmations: int, replace_after_blocks: int, max_fee_gwei: float | None
    ) -> TxPolicy:
        """Return the policy a role's settings state (the fee cap in gwei per gas)."""
        cap = None if max_fee_gwei is None else int(max_fee_gwei * 10**9)
        return cls(confirmations, replace_after_blocks, cap)

    def fees(self, base_fee: int, tip: int) -> tuple[int, int]:
        """Return (maxFeePerGas, maxPriorityFeePerGas) for a pending base fee and a tip."""
        max_fee = base_fee * 2 + tip
        if self.max_fee_wei is None or max_fee <= self.max_fee_wei:
            return max_fee, tip
        if base_fee > self.max_fee_wei:
            raise FeeCapError(
                f"the base fee is {base_fee} wei per gas, above this role's cap of "
                f"{self.max_fee_wei}: raise max_fee_wei or wait for cheaper blocks"
            )
        return self.max_fee_wei, min(tip, self.max_fee_wei - base_fee)

    def bumped(self, max_fee: int, tip: int) -> tuple[int, int] | None:
        """Return the fees of a replacement for a transaction sent with these, or None when
        the cap leaves no room for one."""
        new_fee = max(int(max_fee * REPLACEMENT_BUMP), max_fee + 1)
        new_tip = max(int(tip * REPLACEMENT_BUMP), tip + 1)
        if self.max_fee_wei is not None and new_fee > self.max_fee_wei:
            return None
        return new_fee, min(new_tip, new_fee)


def tip_from_history(rewards: list[list[int]]) -> int | None:
    """Return the median of the blocks' 50th-percentile rewards, or None without any."""
    values = [int(block[0]) for block in rewards if block]
    return int(median(values)) if values else None
