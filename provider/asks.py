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
    """Keep one of this provider's asks live on the market in each class it sells."""

    def __init__(
        self,
        *,
        market: MarketHttp,
        private_key: str,
        terms: AskConfig,
        device_classes: tuple[str, ...],
        plan: Plan,
        slo_ms: int,
        domain: Domain,
        clock: ChainClock,
        metrics: ProviderMetrics,
    ) -> None:
        """Post ``terms`` in each of ``device_classes`` whenever no ask of ours is live there."""
        self.market = market
        self._key = private_key
        self.provider = address_of(private_key)
        self.terms = terms
        self.device_classes = device_classes
        self.plan = plan
        self.slo_ms = slo_ms
        self.domain = domain
        self.clock = clock
        self.metrics = metrics

    def run(self) -> list[dict[str, Any]]:
        """Post a fresh ask in each class without a live one that has long enough left;
        return the orders posted."""
        try:
            now = self.clock.chain_now()
            keep = now + self.terms.expiry_s // REFRESH_FRACTION
            live = {
                str(o.get("device_class"))
                for o in live_asks(self.market.base_url, self.provider)
                if int(o.get("expiry", 0)) > keep
            }
        except MarketHttpError as exc:
            self.metrics.asks.labels("failed").inc()
            log.warning("cannot read our asks on the market", extra={"error": str(exc)})
            return []
        posted = []
        for device_class in self.device_classes:
            if device_class in live:
                continue
            signed = signed_ask(
                private_key=self._key,
                terms=self.terms,
                device_class=device_class,
                plan=self.plan,
                slo_ms=self.slo_ms,
                domain=self.domain,
                now=now,
            )
            try:
                order = post_ask(self.market, signed)
            except MarketHttpError as exc:
                self.metrics.asks.labels("failed").inc()
                log.warning(
                    "cannot post the ask", extra={"device_class": device_class, "error": str(exc)}
                )
                continue
            self.metrics.asks.labels("posted").inc()
            log.info(
                "ask posted",
                extra={
                    "device_class": device_class,
                    "quantity": self.terms.quantity,
                    "price": self.terms.price,
                    "expiry": signed.ask.expiry,
                    "order_id": (order.get("order") or order).get("order_id"),
                },
            )
            posted.append(order)
        return posted
