"""A naive reference matching engine: obviously correct, slow, used as the tests' oracle.

It recomputes every match from the full order list: candidates are the live, unexpired,
compatible, crossing orders of the other side in the same device class, sorted by price then
sequence, filled in that order at their own price.
"""

from __future__ import annotations

from dataclasses import dataclass

from market.engine import Fill, Order, OrderState, Side, compatible
from market.errors import (
    DuplicateOrderError,
    OrderExpiredError,
    OrderStateError,
    UnknownOrderError,
)


@dataclass
class ModelOrder:
    """Mutable record of one order in the model."""

    order: Order
    seq: int
    remaining: int
    state: OrderState


class ModelEngine:
    """Reference implementation of the engine's observable behaviour."""

    def __init__(self) -> None:
        """Start empty."""
        self.orders: dict[str, ModelOrder] = {}
        self.next_seq = 1
        self.next_fill_id = 1

    def place(self, order: Order, now: int) -> list[Fill]:
        """Place `order` at `now`, returning the fills the engine must produce."""
        if order.order_id in self.orders:
            raise DuplicateOrderError(order.order_id)
        if order.expiry <= now:
            raise OrderExpiredError(order.order_id, order.expiry, now)
        taker = ModelOrder(order, self.next_seq, order.quantity, OrderState.OPEN)
        self.next_seq += 1
        candidates = [m for m in self.orders.values() if self._can_trade(order, m, now)]
        if order.side is Side.BID:
            candidates.sort(key=lambda m: (m.order.price, m.seq))
        else:
            candidates.sort(key=lambda m: (-m.order.price, m.seq))
        self.orders[order.order_id] = taker
        fills: list[Fill] = []
        for maker in candidates:
            if taker.remaining == 0:
                break
            qty = min(taker.remaining, maker.remaining)
            taker.remaining -= qty
            maker.remaining -= qty
            maker.state = OrderState.FILLED if maker.remaining == 0 else OrderState.PARTIALLY_FILLED
            bid_id, ask_id = (
                (order.order_id, maker.order.order_id)
                if order.side is Side.BID
                else (maker.order.order_id, order.order_id)
            )
            fills.append(
                Fill(
                    self.next_fill_id,
                    order.device_class,
                    bid_id,
                    ask_id,
                    maker.order.price,
                    qty,
                    order.side,
                    now,
                )
            )
            self.next_fill_id += 1
        if fills:
            taker.state = OrderState.FILLED if taker.remaining == 0 else OrderState.PARTIALLY_FILLED
        return fills

    @staticmethod
    def _can_trade(taker: Order, maker: ModelOrder, now: int) -> bool:
        m = maker.order
        if not maker.state.is_live or m.expiry <= now:
            return False
        if m.side is taker.side or m.device_class != taker.device_class:
            return False
        if taker.side is Side.BID:
            return m.price <= taker.price and compatible(taker, m)
        return m.price >= taker.price and compatible(m, taker)

    def cancel(self, order_id: str) -> None:
        """Cancel a live order."""
        model = self.orders.get(order_id)
        if model is None:
            raise UnknownOrderError(order_id)
        if not model.state.is_live:
            raise OrderStateError(order_id, model.state.value, OrderState.CANCELLED.value)
        model.state = OrderState.CANCELLED

    def expire(self, now: int) -> list[str]:
        """Expire live orders due at `now`, then forget every order with `expiry <= now`;
        return the expired ids by (expiry, seq)."""
        due = sorted(
            (m for m in self.orders.values() if m.state.is_live and m.order.expiry <= now),
            key=lambda m: (m.order.expiry, m.seq),
        )
        for m in due:
            m.state = OrderState.EXPIRED
        # Then every order past its expiry is forgotten, live or not.
        self.orders = {i: m for i, m in self.orders.items() if m.order.expiry > now}
        return [m.order.order_id for m in due]

    def states(self) -> list[tuple[str, int, OrderState, int]]:
        """Return (id, seq, state, remaining) of every order in sequence order."""
        return [(m.order.order_id, m.seq, m.state, m.remaining) for m in self.orders.values()]
