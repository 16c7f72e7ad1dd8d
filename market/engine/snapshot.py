"""Plain-data form of the engine's state, for storage and restart.

A snapshot is JSON-ready: dicts, lists, strings and ints only. It lists every order the engine
knows, in sequence order, with its state and unfilled units; restoring it rebuilds each book's
price levels and queues in the same time priority, so the restored engine matches exactly as
the original would have.

The storage layer need not store snapshots: it can build one from its order and fill rows
(each order's fields, `seq`, state and unfilled units; `next_seq` = last seq + 1, `next_fill_id`
= last fill id + 1), which is how the book is rebuilt at restart.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TypedDict, cast, get_type_hints

from market.engine.lifecycle import OrderState
from market.engine.orders import ORDER_FIELDS, Order, OrderRecord, Side
from market.errors import MarketError, SnapshotError

SNAPSHOT_VERSION = 1
"""Version of the snapshot layout written by `record_to_data` and read by `record_from_data`."""


class OrderData(TypedDict):
    """One order record as plain data: the order's fields (`ORDER_FIELDS`, spelled out for the
    type checker and checked against it below), then its progress (`PROGRESS_FIELDS`)."""

    side: str
    order_id: str
    owner: str
    device_class: str
    quantity: int
    price: int
    plan: str
    slo_ms: int
    memory: int
    expiry: int
    seq: int
    state: str
    remaining: int


PROGRESS_FIELDS = ("seq", "state", "remaining")
"""What the engine adds to an order's fields in a record."""
RECORD_FIELDS = (*ORDER_FIELDS, *PROGRESS_FIELDS)
"""The keys of `OrderData`, in order."""
_HINTS = get_type_hints(OrderData)
if tuple(_HINTS) != RECORD_FIELDS:
    raise TypeError(f"OrderData's keys {tuple(_HINTS)} are not {RECORD_FIELDS}")


class SnapshotData(TypedDict):
    """The engine's whole state as plain data."""

    version: int
    next_seq: int
    next_fill_id: int
    orders: list[OrderData]


def record_to_data(record: OrderRecord) -> OrderData:
    """Return `record` as plain data."""
    o = record.order
    data: dict[str, object] = {name: getattr(o, name) for name in ORDER_FIELDS}
    data["side"] = o.side.value
    data["seq"] = record.seq
    data["state"] = record.state.value
    data["remaining"] = record.remaining
    return cast(OrderData, data)


def get_int(data: Mapping[str, object], key: str) -> int:
    """Return `data[key]` as an int; raise `SnapshotError` if absent or not an int."""
    value = data.get(key)
    if not isinstance(value, int) or isinstance(value, bool):
        raise SnapshotError(f"{key} must be an integer, got {value!r}")
    return value


def _get_str(data: Mapping[str, object], key: str) -> str:
    value = data.get(key)
    if not isinstance(value, str):
        raise SnapshotError(f"{key} must be a string, got {value!r}")
    return value


_READ: dict[str, Callable[[Mapping[str, object], str], object]] = {
    name: _get_str if _HINTS[name] is str else get_int for name in ORDER_FIELDS
}
"""How each order field is read: by its type in `OrderData` (`side` is then made a `Side`)."""


def record_from_data(data: object) -> OrderRecord:
    """Parse and check one order record; raise `SnapshotError` if it is malformed."""
    if not isinstance(data, Mapping):
        raise SnapshotError(f"an order record must be a mapping, got {type(data).__name__}")
    try:
        side = Side(_get_str(data, "side"))
        state = OrderState(_get_str(data, "state"))
    except ValueError as exc:
        raise SnapshotError(str(exc)) from exc
    try:
        order = Order(side, *[_READ[name](data, name) for name in ORDER_FIELDS[1:]])
    except SnapshotError:
        raise
    except MarketError as exc:
        raise SnapshotError(str(exc)) from exc
    seq = get_int(data, "seq")
    remaining = get_int(data, "remaining")
    if not _consistent(state, remaining, order.quantity):
        raise SnapshotError(
            f"order {order.order_id!r}: state {state.value} with remaining {remaining} "
            f"of {order.quantity} is impossible"
        )
    return OrderRecord(order=order, seq=seq, state=state, remaining=remaining)


def _consistent(state: OrderState, remaining: int, quantity: int) -> bool:
    if state is OrderState.OPEN:
        return remaining == quantity
    if state is OrderState.PARTIALLY_FILLED:
        return 0 < remaining < quantity
    if state is OrderState.FILLED:
        return remaining == 0
    # Cancelled or expired: withdrawn while live, so some units were left.
    return 0 < remaining <= quantity
