"""Signed market orders for tests and benchmarks: a trader with a key and a nonce counter."""

from __future__ import annotations

import itertools
import os
from dataclasses import dataclass, field, replace
from typing import Any

from contracts.messages import ZERO_ADDRESS, Domain, Plan, Quote, address_of
from contracts.orders import (
    Ask,
    Bid,
    CancelOrder,
    Heartbeat,
    advert_hash,
    market_domain,
    order_request,
)

CHAIN_ID = 31337
ESCROW = "0x" + "e5" * 20
ARBITER = "0x" + "a1" * 20
GIB = 1 << 30
METERED = Plan(price_per_device_ms=2, compile_price=1_000, inference_price=500)


@dataclass
class Trader:
    """A key that signs orders, cancels and heartbeats under one market's domains."""

    key: str = field(default_factory=lambda: "0x" + os.urandom(32).hex())
    chain_id: int = CHAIN_ID
    escrow: str = ESCROW
    arbiter: str = ARBITER
    nonces: itertools.count[int] = field(default_factory=lambda: itertools.count(1))

    @property
    def address(self) -> str:
        """Return the trader's checksummed address."""
        return address_of(self.key)

    @property
    def domain(self) -> Domain:
        """Return the market domain."""
        return market_domain(self.chain_id, self.escrow)

    @property
    def escrow_domain(self) -> Domain:
        """Return the settlement domain (quotes)."""
        return Domain(chain_id=self.chain_id, verifying_contract=self.escrow)

    def _fields(self, overrides: dict[str, Any], now: int) -> dict[str, Any]:
        fields: dict[str, Any] = {
            "owner": self.address,
            "device_class": "tpu-v5e",
            "quantity": 10,
            "price": 100,
            "plan": "metered",
            "slo_ms": 100,
            "memory": 16 * GIB,
            "expiry": now + 3_600,
            "nonce": next(self.nonces),
        }
        fields.update(overrides)
        return fields

    def bid(self, now: int, **overrides: Any) -> dict[str, Any]:
        """Return a signed bid request body."""
        message = Bid(**self._fields(overrides, now))
        return order_request(message, message.sign(self.domain, self.key))

    def quote(self, *, slo_ms: int, valid_until: int, plan: Plan = METERED, **terms: Any) -> Quote:
        """Return an open quote from this trader as provider."""
        values: dict[str, Any] = {
            "provider": self.address,
            "client": ZERO_ADDRESS,
            "arbiter": self.arbiter,
            "max_spend": 10**9,
            "stake": 10**6,
            "penalty": 50_000,
            "duration": 3_600,
            "challenge_window": 60,
            "slo_ms": slo_ms,
            "valid_until": valid_until,
            "nonce": next(self.nonces),
            "plan": plan,
        }
        values.update(terms)
        return Quote(**values)

    def fill_quote(
        self, terms: Quote, *, client: str, max_spend: int, valid_until: int, **changes: Any
    ) -> Quote:
        """Return the quote this provider signs for one fill: the ask's terms (`terms`, the
        ask's quote), naming the deal's client, with a fresh nonce; `changes` alter terms."""
        values: dict[str, Any] = {
            "client": client,
            "max_spend": max_spend,
            "valid_until": valid_until,
            "nonce": next(self.nonces),
        }
        values.update(changes)
        return replace(terms, **values)

    def signed(self, quote: Quote) -> dict[str, Any]:
        """Return the body of `POST /v1/deals/{id}/quote` for `quote` signed by this key."""
        return {
            "quote": quote.to_json(),
            "quote_signature": "0x" + quote.sign(self.escrow_domain, self.key).hex(),
        }

    def ask(
        self,
        now: int,
        *,
        quote: Quote | None = None,
        quote_plan: Plan = METERED,
        **overrides: Any,
    ) -> dict[str, Any]:
        """Return a signed ask request body carrying a signed quote."""
        fields = self._fields(overrides, now)
        q = quote or self.quote(
            slo_ms=fields["slo_ms"], valid_until=fields["expiry"], plan=quote_plan
        )
        message = Ask(**fields, quote_hash=q.struct_hash())
        return order_request(
            message,
            message.sign(self.domain, self.key),
            quote=q,
            quote_signature=q.sign(self.escrow_domain, self.key),
        )

    def cancel(self, order_id: str, now: int, **overrides: Any) -> dict[str, Any]:
        """Return a signed cancel request body."""
        fields: dict[str, Any] = {
            "owner": self.address,
            "order_id": bytes.fromhex(order_id[2:]),
            "nonce": next(self.nonces),
            "expiry": now + 60,
        }
        fields.update(overrides)
        message = CancelOrder(**fields)
        return {
            "owner": message.owner,
            "order_id": "0x" + message.order_id.hex(),
            "nonce": message.nonce,
            "expiry": message.expiry,
            "signature": "0x" + message.sign(self.domain, self.key).hex(),
        }

    def heartbeat(self, timestamp: int, **advert: Any) -> dict[str, Any]:
        """Return a signed heartbeat request body."""
        body: dict[str, Any] = {
            "device_class": "tpu-v5e",
            "device_kind": "TPU v5 lite",
            "device_count": 4,
            "price": 100,
            "throughput": 12.5,
            "capacity": 1_000,
        }
        body.update(advert)
        message = Heartbeat(
            provider=self.address, advert_hash=advert_hash(body), timestamp=timestamp
        )
        return {
            "provider": self.address,
            "timestamp": timestamp,
            "advert": body,
            "signature": "0x" + message.sign(self.domain, self.key).hex(),
        }
