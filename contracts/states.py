"""The escrow's lifecycles as the contract numbers them: a deal, a claimed batch, a task.

The values are the Solidity enums' (`IComputeEscrow.sol`); a test reads them from the compiled
contract. The module-level names are the same members under the names the code has long used.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum


class DealStatus(IntEnum):
    """Where a deal stands on chain."""

    NONE = 0
    OPEN = 1
    CLOSED = 2


class BatchStatus(IntEnum):
    """Where a claimed batch of receipts stands on chain."""

    NONE = 0
    PENDING = 1
    DISPUTED = 2
    PAID = 3
    REJECTED = 4


class TaskStatus(IntEnum):
    """How one task index of a deal has been settled on chain."""

    NONE = 0
    VOUCHED = 1
    CLAIMED = 2
    REFUNDED = 3


DEAL_NONE, DEAL_OPEN, DEAL_CLOSED = DealStatus.NONE, DealStatus.OPEN, DealStatus.CLOSED
BATCH_NONE, BATCH_PENDING, BATCH_DISPUTED, BATCH_PAID, BATCH_REJECTED = (
    BatchStatus.NONE,
    BatchStatus.PENDING,
    BatchStatus.DISPUTED,
    BatchStatus.PAID,
    BatchStatus.REJECTED,
)
TASK_NONE, TASK_VOUCHED, TASK_CLAIMED, TASK_REFUNDED = (
    TaskStatus.NONE,
    TaskStatus.VOUCHED,
    TaskStatus.CLAIMED,
    TaskStatus.REFUNDED,
)


@dataclass(frozen=True)
class DealState:
    """A deal as the escrow stores it; `client_agreed_close` and `provider_agreed_close` say
    whether that party's early-close agreement is in force now (each lapses two challenge
    windows after it is given, or when withdrawn)."""

    client: str
    provider: str
    arbiter: str
    status: int
    expiry: int
    challenge_window: int
    max_spend: int
    committed: int
    vouched: int
    pending: int
    stake: int
    penalty: int
    plan_hash: bytes
    batch_count: int
    client_agreed_close: bool
    provider_agreed_close: bool

    @property
    def locked(self) -> int:
        """Return the client funds still locked in the deal (pending claims included)."""
        return self.max_spend - self.committed if self.status == DealStatus.OPEN else 0


@dataclass(frozen=True)
class BatchState:
    """A claimed batch of receipts as stored."""

    amount: int
    deadline: int
    status: int
    tasks: int
