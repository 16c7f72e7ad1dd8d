"""A client's money on chain: deposits, balances, deals opened within spending caps."""

from __future__ import annotations

from dataclasses import dataclass

from client.errors import ClientError, SpendingCapExceeded
from contracts.binding import DEAL_OPEN, Escrow, Token, TxResult
from contracts.messages import Ack, Quote, address_of


@dataclass(frozen=True)
class Balances:
    """Where a client's tokens are: in its wallet, free in the escrow, locked in open deals."""

    wallet: int
    free: int
    locked: int

    @property
    def total(self) -> int:
        """Return everything the client owns."""
        return self.wallet + self.free + self.locked


class ClientAccount:
    """Deposit, withdraw, open and settle deals for one client key, within a client-wide cap.

    `spending_cap` bounds the sum of caps of the deals this account opens and keeps open:
    `open_deal` refuses a deal that would pass it, before anything is sent to the chain.
    """

    def __init__(
        self, escrow: Escrow, token: Token, private_key: str, *, spending_cap: int | None = None
    ) -> None:
        self.escrow = escrow
        self.token = token
        self.key = private_key
        self.address = address_of(private_key)
        self.spending_cap = spending_cap
        self._deals: set[int] = set()

    def deposit(self, amount: int) -> TxResult:
        """Approve the escrow for `amount` if needed, then deposit it."""
        if amount <= 0:
            raise ClientError("deposit amount must be positive")
        if self.token.allowance(self.address, self.escrow.address) < amount:
            self.token.approve(self.key, self.escrow.address, amount)
        return self.escrow.deposit(self.key, amount)

    def withdraw(self, amount: int) -> TxResult:
        """Withdraw `amount` of the free balance."""
        return self.escrow.withdraw(self.key, amount)

    def balances(self) -> Balances:
        """Return the wallet, free and locked amounts."""
        locked = sum(self.escrow.get_deal(d).locked for d in self._deals)
        return Balances(
            wallet=self.token.balance_of(self.address),
            free=self.escrow.balance_of(self.address),
            locked=locked,
        )

    def committed_caps(self) -> int:
        """Return the sum of the caps of this account's open deals."""
        caps = 0
        for deal_id in self._deals:
            deal = self.escrow.get_deal(deal_id)
            if deal.status == DEAL_OPEN:
                caps += deal.max_spend
        return caps

    def open_deal(self, quote: Quote, signature: bytes, max_spend: int) -> int:
        """Open a deal with a provider-signed quote; return its id."""
        if self.spending_cap is not None and self.committed_caps() + max_spend > self.spending_cap:
            raise SpendingCapExceeded(
                f"a deal capped at {max_spend} would bring open deals to "
                f"{self.committed_caps() + max_spend}, past the client cap {self.spending_cap}"
            )
        result = self.escrow.open_deal(self.key, quote, signature, max_spend)
        deal_id = int(result.event("DealOpened").args["dealId"])
        self._deals.add(deal_id)
        return deal_id

    def refund_breach(self, ack: Ack, signature: bytes) -> tuple[int, int]:
        """Refund a task the provider acked but did not deliver; return (refund, penalty)."""
        event = self.escrow.refund_breach(self.key, ack, signature).event("BreachRefunded").args
        return int(event["refund"]), int(event["penalty"])

    def dispute(self, deal_id: int, batch_id: int) -> TxResult:
        """Dispute a batch of receipts the provider claimed."""
        return self.escrow.dispute_claim(self.key, deal_id, batch_id)

    def close(self, deal_id: int) -> TxResult:
        """Close a deal (or agree to close it early)."""
        return self.escrow.close_deal(self.key, deal_id)
