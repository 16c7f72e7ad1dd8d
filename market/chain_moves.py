"""Which accounts an escrow event moves: whose free balance or stake the market must read again.

Deposited and Withdrawn move the account's balance, Staked and Unstaked the provider's stake;
DealOpened locks its client's and provider's funds; the events that pay out, refund or release a
deal's money move both parties of that deal. The chain indexer applies this to the logs it reads
(`market.indexer`), and a process that follows another's index to the events stored
(`market.follower`), so both read the same accounts again.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from eth_utils.address import to_checksum_address

MOVES_ACCOUNT = {
    "Deposited": "account",
    "Withdrawn": "account",
    "Staked": "provider",
    "Unstaked": "provider",
}
"""Events that move one account's free balance or stake: the field naming it."""

MOVES_DEAL = frozenset(
    {
        "ReservationFeePaid",
        "VoucherRedeemed",
        "ClaimFinalized",
        "DisputeResolved",
        "BreachRefunded",
        "DealClosed",
    }
)
"""Events that pay out, refund or release a deal's money: its client's and provider's free
balance or stake move (DealOpened, which locks them, names both itself)."""


def accounts_moved(name: str, args: Mapping[str, Any], parties: tuple[str, str] | None) -> set[str]:
    """Return the accounts (checksummed) event `name` with `args` moves; `parties` are the
    (client, provider) of the indexed deal it names, if any."""
    moved: set[str] = set()
    account = MOVES_ACCOUNT.get(name)
    if account is not None:
        moved.add(to_checksum_address(args[account]))
    if name == "DealOpened":
        moved.update(to_checksum_address(args[a]) for a in ("client", "provider"))
    elif name in MOVES_DEAL and parties is not None:
        moved.update(to_checksum_address(a) for a in parties)
    return moved
