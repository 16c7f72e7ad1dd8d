"""The provider's ask on the market, built from the config's ``[ask]`` terms and kept live.

An ask carries a quote naming no client: only the signed terms (plan, SLO, stake, penalty,
challenge window, arbiter, duration) every per-fill quote repeats (:mod:`provider.quotes`).
:func:`signed_ask` builds both; :class:`AskJob` (run by the daemon's scheduler) posts a fresh
ask whenever none of this provider's asks on the market is live long enough, and
``tpumarket provider ask`` posts one by hand.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

import httpx

from client.market_http import MarketHttp, MarketHttpError
from contracts.messages import ZERO_ADDRESS, Domain, Plan, Quote, address_of
from contracts.orders import Ask, market_domain, plan_kind
from provider.clock import ChainClock
from provider.config import AskConfig
from provider.metrics import ProviderMetrics

log = logging.getLogger("provider.asks")
REFRESH_FRACTION = 5
"""A fresh ask is posted when the live ones have less than ``expiry_s / 5`` left."""


@dataclass(frozen=True, slots=True)
class SignedAsk:
    """An ask and its quote, both signed by the provider."""

    ask: Ask
    signature: bytes
    quote: Quote
    quote_signature: bytes


def signed_ask(
    *,
    private_key: str,
    terms: AskConfig,
    device_class: str,
    plan: Plan,
    slo_ms: int,
    domain: Domain,
    now: int,
    nonce: int | None = None,
) -> SignedAsk:
    """Sign an ask offering ``terms`` until ``now + terms.expiry_s`` and its client-less quote.

    The nonce (one space for the market's orders and the escrow's quotes) defaults to the
    time in microseconds.
    """
    provider = address_of(private_key)
    expiry = now + terms.expiry_s
    used = time.time_ns() // 1_000 if nonce is None else nonce
    quote = Quote(
        provider=provider,
        client=ZERO_ADDRESS,
        arbiter=terms.arbiter,
        max_spend=terms.price * terms.quantity,
        stake=terms.stake,
        penalty=terms.penalty,
        duration=terms.duration,
        challenge_window=terms.challenge_window,
        slo_ms=slo_ms,
        valid_until=expiry,
        nonce=used,
        plan=plan,
    )
    ask = Ask(
        owner=provider,
        device_class=device_class,
        quantity=terms.quantity,
        price=terms.price,
        plan=plan_kind(plan),
        slo_ms=slo_ms,
        memory=terms.memory,
        expiry=expiry,
        nonce=used,
        quote_hash=quote.struct_hash(),
    )
    market = market_domain(domain.chain_id, domain.verifying_contract)
    return SignedAsk(
        ask=ask,
        signature=ask.sign(market, private_key),
        quote=quote,
        quote_signature=quote.sign(domain, private_key),
    )


def post_ask(market: MarketHttp, signed: SignedAsk) -> dict[str, Any]:
    """Place a signed ask on ``market``; return the order the market answers."""
    return market.place_order(
        signed.ask,
        signed.signature,
        quote=signed.quote,
        quote_signature=signed.quote_signature,
    )


def live_asks(market_url: str, owner: str, *, timeout_s: float = 10.0) -> list[dict[str, Any]]:
    """Return ``owner``'s live asks on the market (``GET /v1/orders?owner=&live=true``)."""
    try:
        reply = httpx.get(
            market_url.rstrip("/") + "/v1/orders",
            params={"owner": owner, "live": "true", "limit": 500},
            timeout=timeout_s,
        )
    except httpx.HTTPError as exc:
        raise MarketHttpError(f"market at {market_url} unreachable: {exc}") from exc
    if reply.status_code >= 400:
        raise MarketHttpError(
            f"market refused the order listing: {reply.status_code} {reply.text[:300]}",
            reply.status_code,
        )
    body = reply.json()
    if not isinstance(body, list):
        raise MarketHttpError("market answered the order listing with something else than a list")
    return [o for o in body if isinstance(o, dict) and o.get("side") == "ask"]


class AskJob:
    """Keep one of this provider's asks live on the market, as the config states it."""

    def __init__(
        self,
        *,
        market: MarketHttp,
        private_key: str,
        terms: AskConfig,
        device_class: str,
        plan: Plan,
        slo_ms: int,
        domain: Domain,
        clock: ChainClock,
        metrics: ProviderMetrics,
    ) -> None:
        """Post ``terms`` for ``device_class`` on ``market`` whenever no ask of ours is live."""
        self.market = market
        self._key = private_key
        self.provider = address_of(private_key)
        self.terms = terms
        self.device_class = device_class
        self.plan = plan
        self.slo_ms = slo_ms
        self.domain = domain
        self.clock = clock
        self.metrics = metrics

    def run(self) -> dict[str, Any] | None:
        """Post a fresh ask unless a live one has long enough left; return the posted order."""
        try:
            now = self.clock.chain_now()
            keep = now + self.terms.expiry_s // REFRESH_FRACTION
            live = [
                o
                for o in live_asks(self.market.base_url, self.provider)
                if o.get("device_class") == self.device_class and int(o.get("expiry", 0)) > keep
            ]
            if live:
                return None
            signed = signed_ask(
                private_key=self._key,
                terms=self.terms,
                device_class=self.device_class,
                plan=self.plan,
                slo_ms=self.slo_ms,
                domain=self.domain,
                now=now,
            )
            order = post_ask(self.market, signed)
        except MarketHttpError as exc:
            self.metrics.asks.labels("failed").inc()
            log.warning("cannot post the ask", extra={"error": str(exc)})
            return None
        self.metrics.asks.labels("posted").inc()
        log.info(
            "ask posted",
            extra={
                "device_class": self.device_class,
                "quantity": self.terms.quantity,
                "price": self.terms.price,
                "expiry": signed.ask.expiry,
                "order_id": (order.get("order") or order).get("order_id"),
            },
        )
        return order
