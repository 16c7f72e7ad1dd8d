"""Orders as submitted by their owners, and the engine's view of an order's progress."""

from __future__ import annotations

from enum import StrEnum
from typing import Final, NamedTuple

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


_TEXT = "must be a non-empty string"

ORDER_FIELDS: Final = (
    "side",
    "order_id",
    "owner",
    "device_class",
    "quantity",
    "price",
    "plan",
    "slo_ms",
    "memory",
    "expiry",
)
"""An order's fields, in the order `Order` takes them: the one declaration. The snapshot's
`OrderData`, the SQL columns (`market.storage.ORDER_COLUMNS`) and the rows the writer stores
derive theirs from it, or are checked against it where a type must be spelled out."""


class Order:
    """An order as its owner signed it; immutable, validated on construction.

    `quantity` counts units (device-seconds or tasks) and `price` is the limit price per unit in
    the settlement token's base units. For an ask, `slo_ms` is the worst latency the provider
    offers and `memory` the bytes it offers; for a bid they are the latency the client requires
    and the bytes it needs. The order may trade while `now < expiry` (unix seconds). Its time
    priority (sequence number) is assigned by the engine on placement, see `OrderRecord.seq`.

    A plain class, not a dataclass: compiled (`market.native`), its checks and attribute stores
    run as C, about five times cheaper than a frozen dataclass's `__init__`. Its fields are
    `Final` (assigning one raises `AttributeError`); equality and hashing are by value.
    """

    # `ORDER_FIELDS`, spelled out: mypyc lays a native class out from a literal `__slots__`
    # only (from the name, the engine ran ~1.7x slower); a test holds the two equal.
    __slots__ = (
        "device_class",
        "expiry",
        "memory",
        "order_id",
        "owner",
        "plan",
        "price",
        "quantity",
        "side",
        "slo_ms",
    )

    def __init__(
        self,
        side: object,
        order_id: object,
        owner: object,
        device_class: object,
        quantity: object,
        price: object,
        plan: object,
        slo_ms: object,
        memory: object,
        expiry: object,
    ) -> None:
        """Build an order; raise `InvalidOrderError` (or a subclass) for a field no order may
        carry: a side that is not a `Side`, an empty string, a quantity or price below 1, an SLO
        below 1 ms, a negative memory or expiry. Booleans are not integers here. The fields
        are typed `object` so that a wrong type gets the same error as a wrong value."""
        if not isinstance(side, Side):
            raise InvalidOrderError("side", side, "must be a Side")
        if not isinstance(order_id, str) or not order_id:
            raise InvalidOrderError("order_id", order_id, _TEXT)
        if not isinstance(owner, str) or not owner:
            raise InvalidOrderError("owner", owner, _TEXT)
        if not isinstance(device_class, str) or not device_class:
            raise InvalidOrderError("device_class", device_class, _TEXT)
        if not isinstance(plan, str) or not plan:
            raise InvalidOrderError("plan", plan, _TEXT)
        if type(quantity) is not int or quantity <= 0:
            raise InvalidQuantityError(quantity)
        if type(price) is not int or price <= 0:
            raise InvalidPriceError(price)
        if type(slo_ms) is not int or slo_ms <= 0:
            raise InvalidOrderError("slo_ms", slo_ms, "must be a positive integer")
        if type(memory) is not int or memory < 0:
            raise InvalidOrderError("memory", memory, "must be a non-negative integer")
        if type(expiry) is not int or expiry < 0:
            raise InvalidOrderError("expiry", expiry, "must be a non-negative integer")
        self.side: Final[Side] = side
        self.order_id: Final[str] = order_id
        self.owner: Final[str] = owner
        self.device_class: Final[str] = device_class
        self.quantity: Final[int] = quantity
        self.price: Final[int] = price
        self.plan: Final[str] = plan
        self.slo_ms: Final[int] = slo_ms
        self.memory: Final[int] = memory
        self.expiry: Final[int] = expiry

    def __setattr__(self, name: str, value: object) -> None:
        """Refuse to change a field (compiled, `__init__` stores them natively, not here)."""
        if hasattr(self, name):
            raise AttributeError(f"cannot assign to field {name!r}: an order is immutable")
        object.__setattr__(self, name, value)

    def _key(self) -> tuple[object, ...]:
        return tuple([getattr(self, name) for name in ORDER_FIELDS])

    def __eq__(self, other: object) -> bool:
        """Return whether `other` is an order with the same fields."""
        if not isinstance(other, Order):
            return NotImplemented
        return self._key() == other._key()

    def __hash__(self) -> int:
        """Hash by value (orders are immutable)."""
        return hash(self._key())

    def __repr__(self) -> str:
        """Return the fields, as a dataclass would."""
        fields = ", ".join(
            f"{name}={value!r}" for name, value in zip(ORDER_FIELDS, self._key(), strict=True)
        )
        return f"Order({fields})"


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
