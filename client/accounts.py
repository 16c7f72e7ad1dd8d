"""A client's money on chain: deposits, balances, deals opened within spending caps.

Before a deal is opened its quote is checked, not trusted: it must name this client, give a
challenge window no shorter than the escrow's minimum and the client's own, name an arbiter
other than the provider, and keep the terms of the ask the client bid on (plan, SLO, stake,
penalty, window, arbiter, duration; a spend at least the deal's). After a match the client
waits (bounded) for the provider's per-fill quote naming it (`wait_for_quote`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from client.amounts import tokens
from client.arbiter_choice import check_arbiter, configured_arbiters
from client.errors import ClientError, DealMismatch, SpendingCapExceeded
from client.market_http import MarketHttp
from contracts.binding import DEAL_OPEN, Escrow, Token, TxResult
from contracts.errors import SignatureError
from contracts.messages import ZERO_ADDRESS, Ack, Quote, TaskRequest, address_of
from contracts.pricing import locked_stake

DEFAULT_MIN_CHALLENGE_WINDOW = 60
"""The shortest challenge window this client accepts (seconds): its time to dispute a claim."""
QUOTE_WAIT_S = 60.0
"""How long `wait_for_quote` waits for the provider's per-fill quote by default."""
TERMS = (
    "provider",
    "arbiter",
    "penalty",
    "duration",
    "challenge_window",
    "slo_ms",
    "plan",
)
"""Quote fields a per-fill quote must copy from the ask's quote."""


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
    open_block: int = 0


class ClientAccount:
    """Deposit, withdraw, open and settle deals for one client key, within a client-wide cap.

    `spending_cap` bounds the sum of caps of the deals this account opens and keeps open:
    `open_deal` refuses a deal that would pass it, before anything is sent to the chain.
    `min_challenge_window` is the shortest window the client accepts (on top of the escrow's
    own minimum): the time it has to dispute a claim of work it did not get.
    """

    def __init__(
        self,
        escrow: Escrow,
        token: Token,
        private_key: str,
        *,
        spending_cap: int | None = None,
        min_challenge_window: int = DEFAULT_MIN_CHALLENGE_WINDOW,
        arbiters: frozenset[str] | None = None,
    ) -> None:
        self.escrow = escrow
        # The arbiters this client accepts (lowercase; None: any but nobody and the provider).
        self.arbiters = configured_arbiters() if arbiters is None else arbiters
        self.token = token
        self.key = private_key
        self.address = address_of(private_key)
        self.spending_cap = spending_cap
        self.min_challenge_window = min_challenge_window
        self.last_open_block = 0
        self._deals: set[int] = set()
        self._escrow_min_window: int | None = None

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

    def check_quote(
        self, quote: Quote, max_spend: int, *, terms: Quote | None = None, what: str = "the quote"
    ) -> None:
        """Raise ``DealMismatch`` unless ``quote`` is safe for this client to open.

        It must name this client, give a challenge window at least the escrow's minimum and
        this client's, name an arbiter that is neither nobody nor the provider, accept
        ``max_spend``, and, given the ask's quote ``terms``, keep every one of its terms.
        """
        if quote.client.lower() != self.address.lower():
            raise DealMismatch(f"{what} is for {quote.client}, not for this client {self.address}")
        if self._escrow_min_window is None:
            self._escrow_min_window = self.escrow.min_challenge_window()
        least = max(self._escrow_min_window, self.min_challenge_window)
        if quote.challenge_window < least:
            raise DealMismatch(
                f"{what} gives a challenge window of {quote.challenge_window} s, under the "
                f"{least} s this client needs to dispute a claim (escrow minimum "
                f"{self._escrow_min_window} s, client minimum {self.min_challenge_window} s)"
            )
        if quote.arbiter.lower() in (ZERO_ADDRESS.lower(), quote.provider.lower()):
            raise DealMismatch(f"{what} names {quote.arbiter} as arbiter: the provider or nobody")
        check_arbiter(quote.arbiter, self.arbiters, what)
        if not 0 < max_spend <= quote.max_spend:
            raise DealMismatch(
                f"{what}: a cap of {tokens(max_spend)} tokens is outside the quote's "
                f"(0, {tokens(quote.max_spend)}]"
            )
        if terms is not None:
            changed = [t for t in TERMS if getattr(quote, t) != getattr(terms, t)]
            # The fill holds its share of the ask's stake (the ask's covers its whole spend):
            # what opening for ``max_spend`` locks must be at least that share.
            share = locked_stake(terms.stake, terms.max_spend, min(max_spend, terms.max_spend))
            if locked_stake(quote.stake, quote.max_spend, max_spend) < share:
                changed.append("stake")
            if changed:
                raise DealMismatch(
                    f"{what} changes the terms of the ask it fills: {', '.join(changed)}"
                )

    def open_deal(
        self, quote: Quote, signature: bytes, max_spend: int, *, terms: Quote | None = None
    ) -> int:
        """Open a deal with a provider-signed quote after checking it; return its id.

        ``terms`` is the quote of the ask the client bid on, when the deal came from the
        market: the per-fill quote must keep its terms (see ``check_quote``).
        """
        self.check_quote(quote, max_spend, terms=terms)
        if self.spending_cap is not None and self.committed_caps() + max_spend > self.spending_cap:
            raise SpendingCapExceeded(
                f"a deal capped at {tokens(max_spend)} tokens would bring open deals to "
                f"{tokens(self.committed_caps() + max_spend)}, past the client cap "
                f"{tokens(self.spending_cap)}"
            )
        result = self.escrow.open_deal(self.key, quote, signature, max_spend)
        deal_id = int(result.event("DealOpened").args["dealId"])
        self.last_open_block = result.block_number
        self._deals.add(deal_id)
        return deal_id

    def open_market_deal(
        self, record: Mapping[str, Any], *, max_spend: int | None = None
    ) -> OpenedDeal:
        """Open a matched market deal on chain with the provider's per-fill quote.

        ``record`` is the market's deal record (``MarketHttp.deal``). Check first that the deal
        is this client's, that its quote names this client, is the one the deal records, is
        signed by the deal's provider and keeps the terms of the ask's signed quote (and of
        our bid: plan kind, an SLO no slower), then ``check_quote``; raise ``DealMismatch``
        otherwise. ``max_spend`` defaults to the deal's value (price times quantity).
        """
        market_id = str(record.get("deal_id", "?"))
        if str(record.get("client", "")).lower() != self.address.lower():
            raise DealMismatch(f"deal {market_id} is {record.get('client')}'s, not ours")
        if record.get("chain_deal_id") is not None:
            raise DealMismatch(
                f"deal {market_id} is already open on chain as {record['chain_deal_id']}"
            )
        quote, signature = self._signed_quote(record, market_id)
        if quote is None or signature is None:
            raise DealMismatch(f"deal {market_id} has no provider quote to open it with yet")
        if quote.client.lower() != self.address.lower():
            raise DealMismatch(
                f"deal {market_id}: the quote is for {quote.client}, not us (the provider has "
                "not signed this fill's quote yet)"
            )
        if "0x" + quote.struct_hash().hex() != str(record.get("quote_hash", "")).lower():
            raise DealMismatch(f"deal {market_id}: the quote is not the one the deal records")
        ask = record.get("ask") if isinstance(record.get("ask"), Mapping) else None
        terms, _ = self._signed_quote(ask or {}, market_id, what="the ask's quote")
        if terms is None:
            raise DealMismatch(f"deal {market_id}: the ask carries no signed quote to compare")
        bid = record.get("bid") if isinstance(record.get("bid"), Mapping) else {}
        assert bid is not None
        if "slo_ms" in bid and quote.slo_ms > int(bid["slo_ms"]):
            raise DealMismatch(
                f"deal {market_id}: the quote's SLO {quote.slo_ms} ms is slower than the "
                f"{bid['slo_ms']} ms our bid accepts"
            )
        cap = int(record["max_spend"]) if max_spend is None else max_spend
        self.check_quote(quote, cap, terms=terms, what=f"deal {market_id}'s quote")
        chain_deal_id = self.open_deal(quote, signature, cap, terms=terms)
        locked = self.escrow.get_deal(chain_deal_id).locked
        return OpenedDeal(market_id, chain_deal_id, quote, cap, locked, self.last_open_block)

    def _signed_quote(
        self, holder: Mapping[str, Any], market_id: str, *, what: str = "the quote"
    ) -> tuple[Quote | None, bytes | None]:
        """Return the quote and signature ``holder`` carries, checked to be the provider's."""
        raw_quote, raw_signature = holder.get("quote"), holder.get("quote_signature")
        if not isinstance(raw_quote, Mapping) or not isinstance(raw_signature, str):
            return None, None
        try:
            quote = Quote.from_json(dict(raw_quote))
            signature = bytes.fromhex(raw_signature.removeprefix("0x"))
            signer = quote.recover(self.escrow.domain, signature)
        except (ValueError, SignatureError) as exc:
            raise DealMismatch(f"deal {market_id}: unreadable {what} or signature: {exc}") from exc
        if signer.lower() != quote.provider.lower():
            raise DealMismatch(
                f"deal {market_id}: {what} is signed by {signer}, not by its provider "
                f"{quote.provider}"
            )
        return quote, signature

    def refund_breach(self, request: TaskRequest, ack: Ack, signature: bytes) -> tuple[int, int]:
        """Refund a task the provider acked but did not deliver; return (refund, penalty)."""
        result = self.escrow.refund_breach(self.key, request, ack, signature)
        event = result.event("BreachRefunded").args
        return int(event["refund"]), int(event["penalty"])

    def dispute(self, deal_id: int, batch_id: int) -> TxResult:
        """Dispute a batch of receipts the provider claimed."""
        return self.escrow.dispute_claim(self.key, deal_id, batch_id)

    def close(self, deal_id: int) -> TxResult:
        """Close a deal (or agree to close it early)."""
        return self.escrow.close_deal(self.key, deal_id)


def wait_for_quote(
    market: MarketHttp,
    client: str,
    deal_id: str,
    *,
    timeout_s: float = QUOTE_WAIT_S,
    poll_s: float = 0.25,
    on_wait: Callable[[float], None] | None = None,
) -> dict[str, Any]:
    """Wait until the market deal ``deal_id`` carries a quote naming ``client``; return it.

    After a match the provider's daemon signs a quote for that fill and attaches it to the
    deal record. ``on_wait`` is told the seconds waited so far at each poll. Raise
    ``DealMismatch`` after ``timeout_s`` (with what the record holds).
    """
    started = time.monotonic()
    while True:
        record = market.deal(deal_id)
        if str(record.get("client", "")).lower() != client.lower():
            raise DealMismatch(f"deal {deal_id} is {record.get('client')}'s, not {client}'s")
        if record.get("chain_deal_id") is not None:
            return record  # opened already: open_market_deal says so
        quote = record.get("quote")
        if isinstance(quote, Mapping) and str(quote.get("client", "")).lower() == client.lower():
            return record
        waited = time.monotonic() - started
        if waited > timeout_s:
            named = quote.get("client") if isinstance(quote, Mapping) else None
            raise DealMismatch(
                f"deal {deal_id}: no quote naming {client} after {timeout_s:.0f} s (the "
                f"record's quote names {named or 'nobody'}): is the provider's daemon running?"
            )
        if on_wait is not None:
            on_wait(waited)
        time.sleep(poll_s)  # polling the market's HTTP API for the provider's quote


def open_market_deal(
    market: MarketHttp,
    account: ClientAccount,
    deal_id: str,
    *,
    max_spend: int | None = None,
    wait_s: float = QUOTE_WAIT_S,
    on_wait: Callable[[float], None] | None = None,
) -> OpenedDeal:
    """Wait for the market deal's per-fill quote, check it and open the deal on chain."""
    record = wait_for_quote(market, account.address, deal_id, timeout_s=wait_s, on_wait=on_wait)
    return account.open_market_deal(record, max_spend=max_spend)
