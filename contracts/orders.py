"""EIP-712 messages of the market: signed asks, bids, cancels and provider heartbeats.

They live under the market's own domain (`tpumarket-market`, version 1, chain id, escrow
address): an order signature is valid for one market on one chain and one escrow, and is never
mistaken for a settlement message (those use the `ComputeEscrow` domain). An ask binds the
provider's signed `Quote` by its struct hash, so a match can become a deal the client opens on
chain with that quote.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from typing import Any, ClassVar, Self

from contracts.hashing import keccak256, keccak_text
from contracts.messages import (
    Domain,
    Plan,
    _attr,
    _from_json,
    _Message,
    _word,
    recover_public,
)

MARKET_DOMAIN_NAME = "tpumarket-market"
MARKET_DOMAIN_VERSION = "1"


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


_LAYOUTS: dict[type[_Message], tuple[tuple[str, str, int], ...]] = {}
_TYPEHASHES: dict[type[_Message], bytes] = {}


def _layout(cls: type[_Message]) -> tuple[tuple[str, str, int], ...]:
    """Return (attribute, EIP-712 kind, bit width of uints) of each field, in type order."""
    layout = _LAYOUTS.get(cls)
    if layout is None:
        layout = _LAYOUTS[cls] = tuple(
            (_attr(n), kind, int(kind[4:]) if kind.startswith("uint") and "[" not in kind else 0)
            for n, kind in cls.TYPES
        )
    return layout


def struct_hash(message: _Message) -> bytes:
    """Return the EIP-712 struct hash of a message, fast (the market verifies every order).

    Equal to `message.struct_hash()` for every message type of `contracts` (tested); supports
    uint, address, bool, bytes32, string and nested message fields.
    """
    parts = [_typehash(type(message))]
    for attr, kind, bits in _layout(type(message)):
        value = getattr(message, attr)
        if bits:
            if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 1 << bits:
                raise ValueError(f"{value!r} does not fit {kind}")
            parts.append(value.to_bytes(32, "big"))
        elif kind == "address":
            parts.append(_address_word(value))
        elif kind == "string":
            if not isinstance(value, str):
                raise ValueError("string field needs a str")
            parts.append(_string_hash(value))
        elif kind == "bytes32":
            if not isinstance(value, bytes) or len(value) != 32:
                raise ValueError("bytes32 field needs exactly 32 bytes")
            parts.append(value)
        elif kind == "bool":
            parts.append((1 if value else 0).to_bytes(32, "big"))
        elif isinstance(value, Plan):
            parts.append(_plan_hash(value))
        elif isinstance(value, _Message):
            parts.append(struct_hash(value))
        else:
            parts.append(message._encode_field(kind, value))
    return keccak256(b"".join(parts))


@functools.lru_cache(maxsize=4_096)
def _string_hash(value: str) -> bytes:
    return keccak256(value.encode())


@functools.lru_cache(maxsize=4_096)
def _plan_hash(plan: Plan) -> bytes:
    return struct_hash(plan)


def digest(message: _Message, domain: Domain) -> bytes:
    """Return the EIP-712 digest of a message under `domain` (fast path of `.digest`)."""
    return keccak256(b"\x19\x01" + domain.separator() + struct_hash(message))


def _address_word(value: object) -> bytes:
    if not isinstance(value, str) or len(value) != 42 or value[:2] not in ("0x", "0X"):
        raise ValueError(f"{value!r} is not an address")
    return bytes(12) + bytes.fromhex(value[2:])


def recover_address(digest: bytes, signature: bytes) -> str:
    """Return the lowercase 0x-address that signed `digest`; raise SignatureError if none did.

    The same rules as `contracts.messages.recover_digest` (65 bytes, v in {27, 28}, low s),
    without the checksum encoding (the market compares addresses case-insensitively).
    """
    return _address_of_public(recover_public(digest, signature))


@functools.lru_cache(maxsize=65_536)
def _address_of_public(public: bytes) -> str:
    # Cached: the same signers come back, and the address costs a keccak.
    return "0x" + keccak256(public[1:])[-20:].hex()


class _MarketMessage(_Message):
    """Market messages: settlement-message machinery plus `string` fields (hashed, EIP-712)."""

    @classmethod
    def typehash(cls) -> bytes:
        """Return keccak256 of the type string (cached per class)."""
        return _typehash(cls)

    def struct_hash(self) -> bytes:
        """Return the EIP-712 struct hash."""
        return struct_hash(self)

    def _encode_field(self, kind: str, value: Any) -> bytes:
        if kind == "string":
            if not isinstance(value, str):
                raise ValueError("string field needs a str")
            return keccak256(value.encode())
        return _word(kind, value)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Self:
        """Build the message from `to_json` output; raise ValueError on bad fields."""
        kwargs: dict[str, Any] = {}
        for name, kind in cls.TYPES:
            attr = _attr(name)
            if attr not in data:
                raise ValueError(f"{cls.TYPE_NAME} lacks field {attr}")
            value = data[attr]
            if kind == "string":
                if not isinstance(value, str):
                    raise ValueError(f"{cls.TYPE_NAME}.{attr} must be a string")
                kwargs[attr] = value
            else:
                kwargs[attr] = _from_json(kind, value, cls)
        return cls(**kwargs)


def _typehash(cls: type[_Message]) -> bytes:
    typehash = _TYPEHASHES.get(cls)
    if typehash is None:
        typehash = _TYPEHASHES[cls] = keccak_text(cls.encode_type())
    return typehash


_ORDER_TYPES: tuple[tuple[str, str], ...] = (
    ("owner", "address"),
    ("deviceClass", "string"),
    ("quantity", "uint64"),
    ("price", "uint256"),
    ("plan", "string"),
    ("sloMs", "uint64"),
    ("memory", "uint64"),
    ("expiry", "uint64"),
    ("nonce", "uint256"),
)


@dataclass(frozen=True)
class Bid(_MarketMessage):
    """A client's signed demand: up to `quantity` units at `price` per unit or less.

    `slo_ms` is the worst latency the client accepts, `memory` the bytes it needs; the bid may
    trade while the market's clock is before `expiry` (unix seconds).
    """

    TYPE_NAME: ClassVar[str] = "Bid"
    TYPES: ClassVar[tuple[tuple[str, str], ...]] = _ORDER_TYPES

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
class Ask(_MarketMessage):
    """A provider's signed offer of `quantity` units at `price` per unit or more.

    `slo_ms` is the latency it commits to, `memory` the bytes it offers, and `quote_hash` the
    struct hash of the signed `Quote` a matched client opens the deal with.
    """

    TYPE_NAME: ClassVar[str] = "Ask"
    TYPES: ClassVar[tuple[tuple[str, str], ...]] = (*_ORDER_TYPES, ("quoteHash", "bytes32"))

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
class CancelOrder(_MarketMessage):
    """An owner's signed withdrawal of one of its orders (by order id, the order's digest)."""

    TYPE_NAME: ClassVar[str] = "CancelOrder"
    TYPES: ClassVar[tuple[tuple[str, str], ...]] = (
        ("owner", "address"),
        ("orderId", "bytes32"),
        ("nonce", "uint256"),
        ("expiry", "uint64"),
    )

    owner: str
    order_id: bytes
    nonce: int
    expiry: int


@dataclass(frozen=True)
class Heartbeat(_MarketMessage):
    """A provider's signed advert: `advert_hash` is keccak256 of the advert's canonical JSON.

    `timestamp` (unix seconds) must grow from one heartbeat to the next, which makes a replayed
    heartbeat useless.
    """

    TYPE_NAME: ClassVar[str] = "Heartbeat"
    TYPES: ClassVar[tuple[tuple[str, str], ...]] = (
        ("provider", "address"),
        ("advertHash", "bytes32"),
        ("timestamp", "uint64"),
    )

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
