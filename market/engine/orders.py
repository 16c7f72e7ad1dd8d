"""Orders as submitted by their owners, and the engine's view of an order's progress."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import NamedTuple

from market.engine.lifecycle import OrderState
from market.errors import InvalidOrderError, InvalidPriceError, InvalidQuantityError


class Side(StrEnum):
    """Side of an order: a bid buys compute, an ask sells it."""

    BID = "bid"
    ASK = "ask"

    @property
    def opposite(self) -> Side:
        """Return the side this side trades against."""
        return Side.ASK if self is Side.BID else Side.BID


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass(frozen=True, slots=True)
class Order:
    """An order as its owner signed it; immutable, validated on construction.

    `quantity` counts units (device-seconds or tasks) and `price` is the limit price per unit in
    the settlement token's base units. For an ask, `slo_ms` is the worst latency the provider
    offers and `memory` the bytes it offers; for a bid they are the latency the client requires
    and the bytes it needs. The order may trade while `now < expiry` (unix seconds). Its time
    priority (sequence number) is assigned by the engine on placement, see `OrderRecord.seq`.
    """

    side: Side
    order_id: str
    owner: str
    device_class: str
    quantity: int
    price: int
    plan: str
    slo_ms: int
    memory: int
    expiry: int

    def __post_init__(self) -> None:
        """Reject fields that no order may carry."""
        if not isinstance(self.side, Side):
            raise InvalidOrderError("side", self.side, "must be a Side")
        for name in ("order_id", "owner", "device_class", "plan"):
            value = getattr(self, name)
            if not isinstance(value, str) or not value:
                raise InvalidOrderError(name, value, "must be a non-empty string")
        if not _is_int(self.quantity) or self.quantity <= 0:
            raise InvalidQuantityError(self.quantity)
        if not _is_int(self.price) or self.price <= 0:
            raise InvalidPriceError(self.price)
        if not _is_int(self.slo_ms) or self.slo_ms <= 0:
            raise InvalidOrderError("slo_ms", self.slo_ms, "must be a positive integer")
        if not _is_int(self.memory) or self.memory < 0:
            raise InvalidOrderError("memory", self.memory, "must be a non-negative integer")
        if not _is_int(self.expiry) or self.expiry < 0:
            raise InvalidOrderError("expiry", self.expiry, "must be a non-negative integer")


class OrderRecord(NamedTuple):
    """The engine's view of one order: the order, its time priority, state and unfilled units.

    Per order, `filled + open_quantity + cancelled_quantity + expired_quantity == quantity`.
    Immutable; a NamedTuple because cancel and expire build one per order on hot paths.
    """

    order: Order
    seq: int
    state: OrderState
    remaining: int

    @property
    def order_id(self) -> str:
        """Return the order's id."""
        return self.order.order_id

    @property
    def filled(self) -> int:
        """Return the units traded so far."""
        return self.order.quantity - self.remaining

    @property
    def open_quantity(self) -> int:
        """Return the units still resting in the book."""
        return self.remaining if self.state.is_live else 0

    @property
    def cancelled_quantity(self) -> int:
        """Return the units withdrawn by a cancel."""
        return self.remaining if self.state is OrderState.CANCELLED else 0

    @property
    def expired_quantity(self) -> int:
        """Return the units withdrawn by expiry."""
        return self.remaining if self.state is OrderState.EXPIRED else 0
