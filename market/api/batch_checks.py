"""A batch refused on what costs nothing, before any of its signatures is recovered.

Recovering one order's signature costs ~80 µs; a 500-order batch whose last order had expired or
reused an earlier order's nonce used to cost the market every other order's recovery first
(~45 ms of CPU) before the refusal. `precheck_batch` runs the checks that need no recovery over
the whole batch, in order of cost, and stops at the first error, with the same error the
verification would give (`market.verify`, `MarketService._verify`):

1. the order count (413 beyond `max_batch`);
2. each order's expiry against the market clock and the longest validity (401, 422);
3. a nonce its claimed owner uses twice in the batch (409);
4. the caller's IP bucket pays for the recoveries to come: one token per order, as that many
   single orders would (the request's own token is one of them; 429 when short).

Only then are signatures recovered, in order, stopping at the first that fails: a wrong
signature is known only by recovering it, so a batch whose last signature is wrong still costs
every recovery before it, priced by step 4. The body itself
was parsed stopping at its first invalid order (`OrderBatch.orders` is fail-fast).
"""

from __future__ import annotations

from collections.abc import Sequence

from contracts.messages import checksum_of
from market.errors import (
    InvalidOrderError,
    MarketError,
    PayloadTooLargeError,
    ReplayError,
    SignatureExpiredError,
)
from market.models import OrderCreate
from market.service import MarketService


def precheck_batch(service: MarketService, orders: Sequence[OrderCreate], caller: str) -> None:
    """Raise the first error of `orders` that needs no signature recovery, if any; then take
    the recoveries' price from `caller`'s IP bucket."""
    try:
        _precheck(service, orders)
        if len(orders) > 1:
            service.ip_limiter.take(caller, len(orders) - 1)
    except MarketError as exc:
        service.metrics.rejected.labels(type(exc).__name__).inc()
        raise


def _precheck(service: MarketService, orders: Sequence[OrderCreate]) -> None:
    most = service.settings.max_batch
    if len(orders) > most:
        raise PayloadTooLargeError(f"at most {most} orders per batch")
    now = service.now()
    ttl = service.verifier.max_order_ttl_s
    for order in orders:
        if order.expiry <= now:
            raise SignatureExpiredError(f"order expired at {order.expiry} (now {now})")
        if order.expiry > now + ttl:
            raise InvalidOrderError("expiry", order.expiry, f"more than {ttl}s ahead")
    seen: set[tuple[str, int]] = set()
    for order in orders:
        key = (order.owner.lower(), order.nonce)
        if key in seen:
            owner = checksum_of(order.owner)
            raise ReplayError(f"nonce {order.nonce} of {owner} appears twice in batch")
        seen.add(key)
