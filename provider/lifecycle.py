"""The provider's lifecycles: a task's state, the settlement actions the journal records, and
the settlement steps and events the metrics count.

The values are the strings the journal stores and the API returns: a member equals its
string, so journals written before these enums open unchanged. A deal's status on chain is
:class:`contracts.states.DealStatus`.
"""

from __future__ import annotations

from enum import StrEnum


class TaskState(StrEnum):
    """Where one acked task stands: ``acked`` until delivered, then how it ended."""

    ACKED = "acked"
    SUCCEEDED = "succeeded"
    FAILED = "failed"


class SettlementAction(StrEnum):
    """A settlement step of a deal, as the journal records it."""

    OPENED = "opened"
    """The deal seen on chain, with its terms."""
    REDEEM = "redeem"
    """A voucher redeemed."""
    CLAIM = "claim"
    """Receipts claimed (a batch pending its challenge window)."""
    FINALIZE = "finalize"
    """A claimed batch paid out."""
    REJECTED = "rejected"
    """A claimed batch the arbiter or a lapse gave to the client."""
    REFUNDED = "refunded"
    """Tasks the client refunded."""
    MISSED = "missed"
    """Tasks whose settlement instant passed off chain."""
    VOUCHER_UNUSABLE = "voucher_unusable"
    """A voucher the escrow refused to redeem."""
    CLOSED = "closed"
    """The deal seen closed on chain."""


class SettlementStep(StrEnum):
    """A step of the settlement jobs, as ``tpumarket_provider_settlement_failures{action}`` and
    the ``"<step> failed"`` log line name it when it fails (the job moves on to the next deal)."""

    DISCOVER = "discover"
    """Reading the ``DealOpened`` logs of this provider's deals."""
    WATCH = "watch"
    """Reading the chain's state of overdue tasks."""
    RECONCILE = "reconcile"
    """Looking up a claim batch the chain holds and the journal lacks."""
    REDEEM = "redeem"
    """Redeeming a voucher."""
    CLAIM = "claim"
    """Claiming receipts."""
    FINALIZE = "finalize"
    """Finalizing a claimed batch."""
    LAPSE = "lapse"
    """Lapsing a dispute the arbiter left past its period."""
    CLOSE = "close"
    """Closing a deal."""


class SettlementEvent(StrEnum):
    """A settlement event the metrics count that the journal does not record as an action."""

    RECONCILED = "reconciled"
    """A claim batch found on chain and journaled (as a ``claim``) after a crash."""
    DISPUTED = "disputed"
    """A claimed batch the client disputed (the arbiter rules; counted once per batch)."""
