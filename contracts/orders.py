"""EIP-712 messages of the market: signed asks, bids, cancels and provider heartbeats.

They live under the market's own domain (`tpumarket-market`, version 1, chain id, escrow
address): an order signature is valid for one market on one chain and one escrow, and is never
mistaken for a settlement message (those use the `ComputeEscrow` domain). An ask binds the
provider's signed `Quote` by its struct hash, so a match can become a deal the client opens on
chain with that quote.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, ClassVar

from contracts.eip712 import Domain, Message, check, definition, digest, struct_hash
from contracts.hashing import keccak256
from contracts.messages import Plan
from contracts.signing import recover_address

__all__ = [
    "MARKET_DOMAIN_NAME",
    "MARKET_DOMAIN_VERSION",
    "Ask",
    "Bid",
    "CancelOrder",
    "Heartbeat",
    "advert_hash",
    "canonical_json",
    "digest",
    "market_domain",
    "order_id",
    "order_request",
    "plan_kind",
    "recover_address",
    "struct_hash",
]

MARKET_DOMAIN_NAME = str(definition()["market"]["domain"]["name"])
MARKET_DOMAIN_VERSION = str(definition()["market"]["domain"]["version"])


def market_domain(chain_id: int, escrow: str) -> Domain:
    """Return the domain market messages are signed under."""
    return Domain(
        chain_id=chain_id,
        verifying_contract=escrow,
        name=MARKET_DOMAIN_NAME,
        version=MARKET_DOMAIN_VERSION,
    )


def plan_kind(plan: Plan) -> str:
    """Return the label a plan trades under: the most specific of its features.

    `reserved` > `tiered` > `outcome` > `metered` (any per-ms price) > `flat`.
    """
    if plan.reservation_fee or plan.reserved_discount_bps:
        return "reserved"
    if plan.tier1_discount_bps or plan.tier2_discount_bps:
        return "tiered"
    if plan.outcome_based:
        return "outcome"
    if plan.price_per_device_ms:
        return "metered"
    return "flat"


@dataclass(frozen=True)
class Bid(Message):
    """A client's signed demand: up to `quantity` units at `price` per unit or less.

    `slo_ms` is the worst latency the client accepts, `memory` the bytes it needs; the bid may
    trade while the market's clock is before `expiry` (unix seconds).
    """

    TYPE_NAME: ClassVar[str] = "Bid"

    owner: str
    device_class: str
    quantity: int
    price: int
    plan: str
    slo_ms: int
    memory: int
    expiry: int
    nonce: int


@dataclass(frozen=True)
class Ask(Message):
    """A provider's signed offer of `quantity` units at `price` per unit or more.

    `slo_ms` is the latency it commits to, `memory` the bytes it offers, and `quote_hash` the
    struct hash of the signed `Quote` a matched client opens the deal with.
    """

    TYPE_NAME: ClassVar[str] = "Ask"

    owner: str
    device_class: str
    quantity: int
    price: int
    plan: str
    slo_ms: int
    memory: int
    expiry: int
    nonce: int
    quote_hash: bytes


@dataclass(frozen=True)
class CancelOrder(Message):
    """An owner's signed withdrawal of one of its orders (by order id, the order's digest)."""

    TYPE_NAME: ClassVar[str] = "CancelOrder"

    owner: str
    order_id: bytes
    nonce: int
    expiry: int


@dataclass(frozen=True)
class Heartbeat(Message):
    """A provider's signed advert: `advert_hash` is keccak256 of the advert's canonical JSON.

    `timestamp` (unix seconds) must grow from one heartbeat to the next, which makes a replayed
    heartbeat useless.
    """

    TYPE_NAME: ClassVar[str] = "Heartbeat"

    provider: str
    advert_hash: bytes
    timestamp: int


def order_id(message: Ask | Bid, domain: Domain) -> str:
    """Return an order's id: its EIP-712 digest as 0x-hex (unique per market and chain)."""
    return "0x" + message.digest(domain).hex()


def canonical_json(value: Any) -> bytes:
    """Return the canonical JSON bytes a heartbeat hashes: sorted keys, no spaces, ASCII."""
    return json.dumps(value, sort_keys=True, separators=(",", ":")).encode()


def advert_hash(advert: dict[str, Any]) -> bytes:
    """Return keccak256 of an advert's canonical JSON (what a `Heartbeat` signs)."""
    return keccak256(canonical_json(advert))


def order_request(
    message: Ask | Bid,
    signature: bytes,
    *,
    quote: Any | None = None,
    quote_signature: bytes | None = None,
) -> dict[str, Any]:
    """Return the JSON body the market's `POST /v1/orders` takes for a signed order.

    An ask passes its `contracts.messages.Quote` and the provider's signature of it under the
    escrow's domain; `message.quote_hash` must be that quote's struct hash.
    """
    body: dict[str, Any] = {
        "side": "ask" if isinstance(message, Ask) else "bid",
        "owner": message.owner,
        "device_class": message.device_class,
        "quantity": message.quantity,
        "price": message.price,
        "plan": message.plan,
        "slo_ms": message.slo_ms,
        "memory": message.memory,
        "expiry": message.expiry,
        "nonce": message.nonce,
        "signature": "0x" + signature.hex(),
    }
    if quote is not None:
        body["quote"] = quote.to_json()
        body["quote_signature"] = "0x" + (quote_signature or b"").hex()
    return body


for _message in (Bid, Ask, CancelOrder, Heartbeat):
    check(_message)  # a class that drifts from typed_data.json fails here, at import
