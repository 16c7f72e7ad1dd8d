"""Verification of signed writes: fields, expiry, the owner's signature and an ask's quote.

Runs in the request's thread, before the writer sees the order: secp256k1 recovery releases
the interpreter lock, so two requests verify in parallel while the writer matches and commits.
A request's orders are checked field by field, then their signatures recovered up to
`RECOVER_CHUNK` orders at a time in one library call (`contracts.signing.recover_addresses`):
the lock is let go once per chunk rather than three times per signature, so threads verifying
side by side wait less on each other. Every order's signature is recovered (and an ask's quote
signature too); nothing is cached across signatures except the address of a recovered public
key.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from contracts.errors import SignatureError
from contracts.hashing import keccak256
from contracts.messages import ZERO_ADDRESS, Domain, Plan, Quote, checksum_of
from contracts.orders import Ask, Bid, plan_kind, recover_address
from contracts.orders import digest as order_digest
from contracts.orders import struct_hash as message_struct_hash
from contracts.pricing import locked_stake, plan_is_valid
from contracts.signing import recover_addresses
from market.engine import Order as EngineOrder
from market.engine import Side
from market.errors import (
    AuthError,
    ChallengeWindowTooShortError,
    InvalidOrderError,
    MarketError,
    SignatureExpiredError,
)
from market.models import Deal, OrderCreate, QuoteIn


class CheckedOrder(NamedTuple):
    """A verified order: its engine form, its stored fields, its nonce and quote."""

    order: EngineOrder
    signature: str
    quote_json: str | None
    quote_signature: str | None
    quote_hash: str | None
    nonce: int
    created_at: float


class Verifier:
    """Check signed orders and quotes under one market's domains."""

    def __init__(
        self,
        domain: Domain,
        escrow_domain: Domain,
        max_order_ttl_s: int,
        *,
        min_challenge_window: Callable[[], int] = lambda: 1,
    ) -> None:
        """Verify orders under `domain` and quotes under `escrow_domain`; an ask's quote needs a
        challenge window of at least `min_challenge_window()` seconds (asked per ask: the
        market reads it from the escrow once)."""
        self.domain = domain
        self.escrow_domain = escrow_domain
        self.max_order_ttl_s = max_order_ttl_s
        self.min_challenge_window = min_challenge_window
        self._quote_prefix = b"\x19\x01" + escrow_domain.separator()

    def order(self, order_in: OrderCreate, now: int, created_at: float) -> CheckedOrder:
        """Verify one signed order; return it ready for the writer, or raise a MarketError."""
        return self.orders([order_in], now, created_at)[0]

    def orders(
        self, orders_in: Sequence[OrderCreate], now: int, created_at: float
    ) -> list[CheckedOrder]:
        """Verify signed orders; return them ready for the writer, or raise the first failing
        one's MarketError, as `order` on each in turn would.

        Each order's fields are checked and its digests made first; then the signatures of up to
        `RECOVER_CHUNK` orders are recovered in one library call (the interpreter lock let go
        once for them all) and compared. Orders after the chunk holding the first failure are
        never recovered: a refused batch costs at most the rest of its failing order's chunk
        (each order has paid its rate-limit token before any recovery)."""
        checked: list[CheckedOrder] = []
        for start in range(0, len(orders_in), RECOVER_CHUNK):
            prepared: list[_Prepared] = []
            failure: MarketError | None = None
            for order_in in orders_in[start : start + RECOVER_CHUNK]:
                try:
                    prepared.append(self._prepare(order_in, now))
                except MarketError as exc:
                    failure = exc  # raised after those before it are checked
                    break
            signers = recover_addresses(
                [(digest, signature) for p in prepared for digest, signature, _ in p.signatures]
            )
            at = 0
            for p in prepared:
                for _, _, kind in p.signatures:
                    signer = signers[at]
                    at += 1
                    if isinstance(signer, SignatureError):
                        raise AuthError(f"bad {kind} signature: {signer}") from signer
                    if signer != p.owner.lower():
                        raise AuthError(
                            f"quote signed by {signer}, not by the provider {p.owner}"
                            if kind == "Quote"
                            else f"order signed by {signer}, not by its owner {p.owner}"
                        )
                checked.append(p.checked(created_at))
            if failure is not None:
                raise failure
        return checked

    def _prepare(self, order_in: OrderCreate, now: int) -> _Prepared:
        """Check an order's fields and make its digests (its quote's first): all but recovery."""
        owner = checksum(order_in.owner)
        expiry = order_in.expiry
        if expiry <= now:
            raise SignatureExpiredError(f"order expired at {expiry} (now {now})")
        if expiry > now + self.max_order_ttl_s:
            raise InvalidOrderError("expiry", expiry, f"more than {self.max_order_ttl_s}s ahead")
        quote_json: str | None = None
        quote_hash: str | None = None
        message: Ask | Bid
        signatures: list[tuple[bytes, bytes, str]] = []
        terms: dict[str, Any] = {
            "owner": owner,
            "device_class": order_in.device_class,
            "quantity": order_in.quantity,
            "price": order_in.price,
            "plan": order_in.plan,
            "slo_ms": order_in.slo_ms,
            "memory": order_in.memory,
            "expiry": expiry,
            "nonce": order_in.nonce,
        }
        if order_in.side == "ask":
            quote = order_in.quote
            quote_signature = order_in.quote_signature
            if quote is None or quote_signature is None:
                raise InvalidOrderError("quote", None, "an ask carries the provider's signed quote")
            quote_struct = self._ask_quote(order_in, quote, owner)
            signatures.append(
                (
                    keccak256(self._quote_prefix + quote_struct),
                    signature_bytes("Quote", quote_signature),
                    "Quote",
                )
            )
            quote_json = quote.model_dump_json()
            quote_hash = "0x" + quote_struct.hex()
            message = Ask(**terms, quote_hash=quote_struct)
            side = Side.ASK
        else:
            if order_in.quote is not None or order_in.quote_signature is not None:
                raise InvalidOrderError("quote", "...", "a bid carries no quote")
            message = Bid(**terms)
            side = Side.BID
        digest = order_digest(message, self.domain)
        signatures.append(
            (digest, signature_bytes(message.TYPE_NAME, order_in.signature), message.TYPE_NAME)
        )
        return _Prepared(
            order_in,
            owner,
            EngineOrder(  # positional, in `ORDER_FIELDS` order: a compiled class takes
                # keywords several times slower
                side,
                "0x" + digest.hex(),
                owner,
                order_in.device_class,
                order_in.quantity,
                order_in.price,
                order_in.plan,
                order_in.slo_ms,
                order_in.memory,
                expiry,
            ),
            signatures,
            quote_json,
            quote_hash,
        )

    def _ask_quote(self, order_in: OrderCreate, q: QuoteIn, owner: str) -> bytes:
        """Check an ask's quote against the ask; return its struct hash."""
        if q.provider.lower() != owner.lower():
            raise InvalidOrderError("quote.provider", q.provider, "must be the ask's owner")
        if q.client.lower() != ZERO_ADDRESS:
            raise InvalidOrderError("quote.client", q.client, "an ask's quote is open (0x0)")
        if q.arbiter.lower() == ZERO_ADDRESS or q.duration == 0 or q.max_spend == 0:
            raise InvalidOrderError("quote", "...", "needs an arbiter, a duration and a cap")
        plan = Plan(**q.plan.model_dump())
        if not plan_is_valid(plan):
            raise InvalidOrderError("quote.plan", "...", "discounts above 100% or tiers unordered")
        kind = plan_kind(plan)
        if kind != order_in.plan:
            raise InvalidOrderError("plan", order_in.plan, f"the quote's plan is {kind!r}")
        if q.slo_ms != order_in.slo_ms:
            raise InvalidOrderError("quote.slo_ms", q.slo_ms, "must equal the ask's slo_ms")
        if q.valid_until < order_in.expiry:
            raise InvalidOrderError(
                "quote.valid_until", q.valid_until, "must last as long as the ask"
            )
        minimum = max(1, self.min_challenge_window())
        if q.challenge_window < minimum:
            raise ChallengeWindowTooShortError(q.challenge_window, minimum)
        return message_struct_hash(quote_message(q, plan))

    def quote(self, q: QuoteIn, plan: Plan, signature: str, provider: str) -> bytes:
        """Return the quote's struct hash if `provider` signed it under the escrow domain."""
        struct = message_struct_hash(quote_message(q, plan))
        signer = recover("Quote", keccak256(self._quote_prefix + struct), signature)
        if signer != provider.lower():
            raise AuthError(f"quote signed by {signer}, not by the provider {provider}")
        return struct


RECOVER_CHUNK = 16
"""Orders whose signatures `Verifier.orders` recovers in one library call."""


class _Prepared(NamedTuple):
    """An order checked but for its signatures: each (digest, signature, message type)."""

    order_in: OrderCreate
    owner: str
    order: EngineOrder
    signatures: list[tuple[bytes, bytes, str]]
    quote_json: str | None
    quote_hash: str | None

    def checked(self, created_at: float) -> CheckedOrder:
        """Return the order ready for the writer, its signatures found to be its owner's."""
        order_in = self.order_in
        return CheckedOrder(
            self.order,
            order_in.signature.lower(),
            self.quote_json,
            order_in.quote_signature.lower() if order_in.quote_signature else None,
            self.quote_hash,
            order_in.nonce,
            created_at,
        )


def quote_message(q: QuoteIn, plan: Plan) -> Quote:
    """Return the EIP-712 quote a `QuoteIn` stands for."""
    return Quote(
        provider=q.provider,
        client=q.client,
        arbiter=q.arbiter,
        max_spend=q.max_spend,
        stake=q.stake,
        penalty=q.penalty,
        duration=q.duration,
        challenge_window=q.challenge_window,
        slo_ms=q.slo_ms,
        valid_until=q.valid_until,
        nonce=q.nonce,
        plan=plan,
    )


def signature_bytes(type_name: str, signature_hex: str) -> bytes:
    """Return a signature's bytes; raise `AuthError` if its text is not hex."""
    try:
        return bytes.fromhex(signature_hex[2:])
    except ValueError as exc:
        raise AuthError(f"bad {type_name} signature: {exc}") from exc


def recover(type_name: str, digest: bytes, signature_hex: str) -> str:
    """Return the lowercase address that signed `digest`; raise `AuthError` if none did."""
    try:
        return recover_address(digest, bytes.fromhex(signature_hex[2:]))
    except (SignatureError, ValueError) as exc:
        raise AuthError(f"bad {type_name} signature: {exc}") from exc


def checksum(address: str) -> str:
    """Return the EIP-55 form of an address (cached: the same traders sign again and again)."""
    try:
        return checksum_of(address)
    except ValueError as exc:
        raise InvalidOrderError("address", address, "not an address") from exc


def check_deal_quote(q: QuoteIn, plan: Plan, deal: Deal, terms: Quote) -> None:
    """Raise `InvalidOrderError` unless a deal's quote names its client and keeps the terms of
    the ask it matched (`terms`, the ask's quote) with a cap covering the deal's spend."""
    if q.client.lower() != deal.client.lower():
        raise InvalidOrderError("quote.client", q.client, f"must be the deal's {deal.client}")
    # The fill holds its share of the ask's stake (the ask's stake covers its whole spend):
    # what opening the deal for its spend locks must cover that share.
    share = locked_stake(terms.stake, terms.max_spend, min(int(deal.max_spend), terms.max_spend))
    if (
        q.max_spend < 1
        or locked_stake(q.stake, q.max_spend, min(int(deal.max_spend), q.max_spend)) < share
    ):
        raise InvalidOrderError("quote.stake", q.stake, f"must lock at least the fill's {share}")
    kept = {
        "arbiter": (q.arbiter.lower(), terms.arbiter.lower()),
        "penalty": (q.penalty, terms.penalty),
        "duration": (q.duration, terms.duration),
        "challenge_window": (q.challenge_window, terms.challenge_window),
        "slo_ms": (q.slo_ms, terms.slo_ms),
        "plan": (plan, terms.plan),
    }
    for name, (given, asked) in kept.items():
        if given != asked:
            raise InvalidOrderError(f"quote.{name}", given, "must keep the ask's terms")
    if q.max_spend < int(deal.max_spend):
        raise InvalidOrderError("quote.max_spend", q.max_spend, f"below deal's {deal.max_spend}")
