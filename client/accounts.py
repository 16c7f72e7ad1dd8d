"""A client's money on chain: deposits, balances, deals opened within spending caps."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from client.errors import ClientError, DealMismatch, SpendingCapExceeded
from client.market_http import MarketHttp
from contracts.binding import DEAL_OPEN, Escrow, Token, TxResult
from contracts.errors import SignatureError
from contracts.messages import ZERO_ADDRESS, Ack, Quote, address_of


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


@dataclass(frozen=True)
class OpenedDeal:
    """A market deal opened on chain: its ids, the quote it opened with and what it locks."""

    market_id: str
    chain_deal_id: int
    quote: Quote
    max_spend: int
    locked: int


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

    def open_market_deal(
        self, record: Mapping[str, Any], *, max_spend: int | None = None
    ) -> OpenedDeal:
        """Open a matched market deal on chain with the provider's signed quote.

        ``record`` is the market's deal record (``MarketHttp.deal``). Check first that the deal
        and its quote name this client (or any client), that the quote is the one the deal
        records and that its signature recovers to the deal's provider; raise ``DealMismatch``
        otherwise. ``max_spend`` defaults to the deal's value (price times quantity).
        """
        market_id = str(record.get("deal_id", "?"))
        if str(record.get("client", "")).lower() != self.address.lower():
            raise DealMismatch(f"deal {market_id} is {record.get('client')}'s, not ours")
        if record.get("chain_deal_id") is not None:
            raise DealMismatch(
                f"deal {market_id} is already open on chain as {record['chain_deal_id']}"
            )
        raw_quote, raw_signature = record.get("quote"), record.get("quote_signature")
        if not isinstance(raw_quote, dict) or not isinstance(raw_signature, str):
            raise DealMismatch(f"deal {market_id} has no provider quote to open it with yet")
        try:
            quote = Quote.from_json(raw_quote)
            signature = bytes.fromhex(raw_signature.removeprefix("0x"))
            signer = quote.recover(self.escrow.domain, signature)
        except (ValueError, SignatureError) as exc:
            raise DealMismatch(f"deal {market_id}: unreadable quote or signature: {exc}") from exc
        if quote.client.lower() not in (ZERO_ADDRESS.lower(), self.address.lower()):
            raise DealMismatch(f"deal {market_id}: the quote is for {quote.client}, not us")
        provider = str(record.get("provider", "")).lower()
        if signer.lower() != provider or quote.provider.lower() != provider:
            raise DealMismatch(
                f"deal {market_id}: the quote is signed by {signer}, not by the deal's "
                f"provider {record.get('provider')}"
            )
        if "0x" + quote.struct_hash().hex() != str(record.get("quote_hash", "")).lower():
            raise DealMismatch(f"deal {market_id}: the quote is not the one the deal records")
        cap = int(record["max_spend"]) if max_spend is None else max_spend
        if not 0 < cap <= quote.max_spend:
            raise DealMismatch(
                f"deal {market_id}: a cap of {cap} is outside the quote's (0, {quote.max_spend}]"
            )
        chain_deal_id = self.open_deal(quote, signature, cap)
        locked = self.escrow.get_deal(chain_deal_id).locked
        return OpenedDeal(market_id, chain_deal_id, quote, cap, locked)

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


def open_market_deal(
    market: MarketHttp, account: ClientAccount, deal_id: str, *, max_spend: int | None = None
) -> OpenedDeal:
    """Read the market deal ``deal_id`` and open it on chain with its quote and the cap."""
    return account.open_market_deal(market.deal(deal_id), max_spend=max_spend)
