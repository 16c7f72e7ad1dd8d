"""The lifecycle of a market deal, one enum shared by the indexer, the reads and the page.

A deal is `matched` when the book paired a bid with an ask and nothing is indexed on chain yet;
the indexer records `opened` and `closed` from the escrow's events; the reads show `paid` or
`refunded` for an open deal whose settlement has begun. The page styles each value
(`.status.<value>` in `market/web/style.css`, kept complete by a test).
"""

from __future__ import annotations

from enum import StrEnum


class DealStatus(StrEnum):
    """Where a deal stands, as the API and the page show it."""

    MATCHED = "matched"
    OPENED = "opened"
    PAID = "paid"
    REFUNDED = "refunded"
    CLOSED = "closed"
