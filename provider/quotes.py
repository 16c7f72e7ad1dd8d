"""Per-fill quotes: one signed quote per market deal, naming that deal's client.

An ask's quote (``client`` = zero) is only the signed terms: the escrow opens a deal only
with a quote whose ``client`` is the caller, so nobody else can open it and lock the stake,
and each fill of an ask gets its own quote. :meth:`QuoteJob.run` polls the market
(``GET /v1/deals?party=<provider>``) for matched deals of this provider, not open on chain,
without a quote naming their client; for each it signs a quote with the ask's terms (plan,
SLO, stake, penalty, challenge window, arbiter, duration), the deal's client, ``maxSpend`` =
the deal's spend, a fresh nonce and ``validUntil = now + quote_valid_s``, journals it and
attaches it (``POST /v1/deals/{deal_id}/quote``). A journaled quote still valid is attached
again rather than signed anew (an attach that failed is retried with the same quote).

Refused (logged and counted, never signed): an ask whose terms are not this daemon's (another
provider, a plan it does not serve, an SLO below its own, a challenge window below what its
settlement jobs need), and a quote whose stake the provider's free stake cannot cover once
the stakes of its other outstanding quotes (valid, not yet opened) are set aside.

A fill's stake is the ask's stake in proportion to the fill's share of the ask's spend
(``contracts.pricing.locked_stake``, the rule ``openDeal`` locks by): the ask's stake covers its
whole quantity, and a bidder that takes one unit holds one unit's share of it, not all of it.

Quotes cost their requester: a quote that expires unopened while the match stands is signed
anew (the client can still open its deal), at most :data:`MAX_QUOTES_PER_FILL` times; after
that the fill is abandoned (no stake is held for it any more) and counts against its client,
whose further fills get no quote once it has abandoned :data:`MAX_ABANDONED_FILLS`.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Mapping
from typing import Any

from client.market_http import MarketHttp, MarketHttpError
from contracts.binding import Escrow
from contracts.errors import ChainError, ContractRevert
from contracts.messages import Plan, Quote, address_of
from contracts.pricing import locked_stake
from provider.clock import ChainClock
from provider.config import SettlementConfig
from provider.journal import Journal, QuoteRecord
from provider.metrics import ProviderMetrics

log = logging.getLogger("provider.quotes")
_DEALS_PER_POLL = 500
_REFRESH_BEFORE_S = 30  # a journaled quote this close to its validUntil is signed anew
MAX_QUOTES_PER_FILL = 3
"""Quotes signed for one fill before it counts as abandoned by its client."""
MAX_ABANDONED_FILLS = 3
"""Abandoned fills after which a client's further fills get no quote."""


class QuoteRefused(Exception):
    """Raised (inside the job) when a deal's quote must not be signed; the reason says why."""


class QuoteJob:
    """Sign and attach a quote for each matched market deal of this provider."""

    def __init__(
        self,
        *,
        market: MarketHttp,
        private_key: str,
        escrow: Escrow,
        journal: Journal,
        plans: Mapping[bytes, Plan],
        slo_ms: int,
        settlement: SettlementConfig,
        metrics: ProviderMetrics,
        clock: ChainClock,
        arbiters: frozenset[str] | None = None,
    ) -> None:
        """Quote on ``market`` for the escrow's deals, with the plans this daemon serves
        (and only naming one of ``arbiters``, lowercase, when given)."""
        self.arbiters = arbiters
        self.market = market
        self._key = private_key
        self.address = address_of(private_key)
        self.escrow = escrow
        self.journal = journal
        self.plans = dict(plans)
        self.slo_ms = slo_ms
        self.settlement = settlement
        self.metrics = metrics
        self.clock = clock
        self._abandoned_by: dict[str, set[str]] = {}
        """Market deals each client let expire unopened, found since this daemon started."""

    def run(self) -> list[QuoteRecord]:
        """Quote every matched deal that lacks a quote naming its client; return those sent."""
        try:
            records = self.market.deals(self.address, limit=_DEALS_PER_POLL)
        except MarketHttpError as exc:
            self.metrics.quotes.labels("market_unreachable").inc()
            log.warning("cannot list the market's deals", extra={"error": str(exc)})
            return []
        try:
            # validUntil is judged by block time: a quote is past only once the latest block is
            # later than it (no block can open it then), and only then is it signed anew.
            now = self.clock.chain_now()
        except (ChainError, ContractRevert) as exc:
            log.warning("cannot read the chain's clock", extra={"error": str(exc)})
            return []
        pending = [r for r in records if self._needs_quote(r, now)]
        if not pending:
            return []
        sent = []
        for record in pending:
            deal_id = str(record["deal_id"])
            try:
                self._check_client(record, now)
                quote = self._quote_for(record)
            except QuoteRefused as exc:
                self.metrics.quotes.labels("refused").inc()
                log.warning("quote refused", extra={"market_deal": deal_id, "reason": str(exc)})
                continue
            except (ChainError, ContractRevert) as exc:
                self.metrics.quotes.labels("chain_unavailable").inc()
                log.warning("cannot quote", extra={"market_deal": deal_id, "error": str(exc)})
                continue
            try:
                self.market.attach_quote(deal_id, quote.quote, quote.signature)
            except MarketHttpError as exc:
                self.metrics.quotes.labels("attach_failed").inc()
                log.warning(
                    "the market refused a quote",
                    extra={"market_deal": deal_id, "status": exc.status, "reason": exc.detail},
                )
                continue
            self.metrics.quotes.labels("attached").inc()
            log.info("quote attached", extra={"market_deal": deal_id, "nonce": quote.quote.nonce})
            sent.append(quote)
        return sent

    def _needs_quote(self, record: Mapping[str, Any], now: float) -> bool:
        """Whether a deal lacks a live quote naming its client (none, or one expiring)."""
        if str(record.get("provider", "")).lower() != self.address.lower():
            return False
        if record.get("chain_deal_id") is not None:
            return False  # opened on chain already
        quote = record.get("quote")
        client = str(record.get("client", "")).lower()
        if not (isinstance(quote, dict) and str(quote.get("client", "")).lower() == client):
            return True
        try:
            valid_until = int(quote.get("valid_until", 0))
        except (TypeError, ValueError):
            return True
        # Expired unopened: sign it anew (the market takes a new quote only once no block can
        # open the one it holds, so a quote still valid, however close to its end, stays).
        return valid_until < now

    def _abandoned(self, deal_id: str, client: str, now: float) -> bool:
        """Whether the client let :data:`MAX_QUOTES_PER_FILL` quotes of this fill expire."""
        expired = [
            q
            for q in self.journal.quotes(deal_id)
            if q.quote.client.lower() == client.lower() and q.quote.valid_until < now
        ]
        return len(expired) >= MAX_QUOTES_PER_FILL

    def _check_client(self, record: Mapping[str, Any], now: float) -> None:
        """Refuse an abandoned fill, and every fill of a client that abandoned too many."""
        deal_id, client = str(record["deal_id"]), str(record["client"])
        if self._abandoned(deal_id, client, now):
            self._abandoned_by.setdefault(client.lower(), set()).add(deal_id)
            raise QuoteRefused(
                f"fill abandoned: {MAX_QUOTES_PER_FILL} quotes for it expired unopened"
            )
        if len(self._abandoned_by.get(client.lower(), ())) >= MAX_ABANDONED_FILLS:
            raise QuoteRefused(f"client {client} left {MAX_ABANDONED_FILLS} or more fills unopened")

    def _quote_for(self, record: Mapping[str, Any]) -> QuoteRecord:
        """Return the journaled quote still valid for this deal, or sign and journal one."""
        deal_id = str(record["deal_id"])
        client = str(record["client"])
        now = self.clock.now()
        for previous in reversed(self.journal.quotes(deal_id)):
            if previous.quote.client.lower() == client.lower() and (
                previous.quote.valid_until > now + _REFRESH_BEFORE_S
            ):
                return previous
        terms = self._terms(record)
        max_spend = int(record["max_spend"])
        quote = Quote(
            provider=self.address,
            client=client,
            arbiter=terms.arbiter,
            max_spend=max_spend,
            stake=locked_stake(terms.stake, terms.max_spend, min(max_spend, terms.max_spend)),
            penalty=terms.penalty,
            duration=terms.duration,
            challenge_window=terms.challenge_window,
            slo_ms=terms.slo_ms,
            valid_until=int(now + self.settlement.quote_valid_s),
            nonce=self._fresh_nonce(),
            plan=terms.plan,
        )
        self._check_stake(quote, now)
        signature = quote.sign(self.escrow.domain, self._key)
        return self.journal.record_quote(deal_id, quote, signature)

    def _terms(self, record: Mapping[str, Any]) -> Quote:
        """Return the ask's signed terms, refusing terms this daemon cannot serve."""
        ask = record.get("ask")
        raw = ask.get("quote") if isinstance(ask, dict) else None
        if not isinstance(raw, dict) or not isinstance(ask, dict):
            raise QuoteRefused("the deal's ask carries no quote terms")
        try:
            terms = Quote.from_json(raw)
        except (ValueError, TypeError, KeyError) as exc:
            raise QuoteRefused(f"the ask's quote does not parse: {exc}") from exc
        if terms.provider.lower() != self.address.lower():
            raise QuoteRefused(f"the ask's quote names provider {terms.provider}")
        if self.arbiters is not None and terms.arbiter.lower() not in self.arbiters:
            raise QuoteRefused(f"the ask's arbiter {terms.arbiter} is not one this daemon accepts")
        if terms.plan.struct_hash() not in self.plans:
            raise QuoteRefused("the ask's plan is not one this daemon serves")
        if terms.slo_ms < self.slo_ms:
            raise QuoteRefused(
                f"the ask's SLO of {terms.slo_ms} ms is below this daemon's {self.slo_ms} ms"
            )
        if int(record["max_spend"]) <= 0:
            raise QuoteRefused("the deal's spend is zero")
        self._check_fill(record, ask)
        problem = self.settlement.window_problem(terms.challenge_window)
        if problem is not None:
            raise QuoteRefused(problem)
        return terms

    @staticmethod
    def _check_fill(record: Mapping[str, Any], ask: Mapping[str, Any]) -> None:
        """Refuse a fill of more units than the ask offers or below its price. A fill at a
        resting bid's higher price spends more than the ask's terms name: it is still this
        ask's units, and its stake share is capped at the ask's whole stake."""
        try:
            units, price = int(record["quantity"]), int(record["price"])
            offered, asked = int(ask["quantity"]), int(ask["price"])
        except (KeyError, TypeError, ValueError) as exc:
            raise QuoteRefused(f"the deal record lacks its fill's terms: {exc}") from exc
        if units > offered:
            raise QuoteRefused(f"the fill's {units} units are more than the ask's {offered}")
        if price < asked:
            raise QuoteRefused(f"the fill's price {price} is below the ask's {asked}")
        if units * price != int(record["max_spend"]):
            raise QuoteRefused("the deal's spend is not its units times its price")

    def _fresh_nonce(self) -> int:
        """Return a random 64-bit quote nonce the escrow has not seen used."""
        while True:
            nonce = secrets.randbits(64)
            if not self.escrow.is_nonce_used(self.address, nonce):
                return nonce

    def _check_stake(self, quote: Quote, now: float) -> None:
        """Refuse a quote whose stake the free stake cannot cover beside outstanding quotes."""
        free = self.escrow.stake_of(self.address)
        live = [
            q.quote
            for q in self.journal.quotes(valid_at=now)
            if q.quote.valid_until >= now and q.quote.nonce != quote.nonce
        ]
        used = (
            self.escrow.read_many([("isNonceUsed", (self.address, q.nonce)) for q in live])
            if live
            else []
        )
        outstanding = sum(q.stake for q, opened in zip(live, used, strict=True) if not opened)
        if free - outstanding < quote.stake:
            raise QuoteRefused(
                f"free stake {free} cannot cover a stake of {quote.stake} beside {outstanding} "
                f"held for {len(live) - sum(bool(u) for u in used)} outstanding quotes"
            )
