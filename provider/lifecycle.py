"""The provider's lifecycles: a task's state and the settlement actions the journal records.

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
