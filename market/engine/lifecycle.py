"""The order lifecycle: states and the only transitions allowed between them."""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum

from market.errors import OrderStateError


class OrderState(StrEnum):
    """Lifecycle state of an order inside the matching engine."""

    OPEN = "open"
    PARTIALLY_FILLED = "partially_filled"
    FILLED = "filled"
    CANCELLED = "cancelled"
    EXPIRED = "expired"

    @property
    def is_live(self) -> bool:
        """Return whether an order in this state rests in the book and can still trade."""
        return self in LIVE_STATES


LIVE_STATES: frozenset[OrderState] = frozenset({OrderState.OPEN, OrderState.PARTIALLY_FILLED})
"""States in which an order rests in the book."""

TERMINAL_STATES: frozenset[OrderState] = frozenset(
    {OrderState.FILLED, OrderState.CANCELLED, OrderState.EXPIRED}
)
"""States an order never leaves."""

_FROM_LIVE = frozenset(
    {OrderState.PARTIALLY_FILLED, OrderState.FILLED, OrderState.CANCELLED, OrderState.EXPIRED}
)

TRANSITIONS: Mapping[OrderState, frozenset[OrderState]] = {
    OrderState.OPEN: _FROM_LIVE,
    # A partially filled order stays partially filled while further partial fills arrive.
    OrderState.PARTIALLY_FILLED: _FROM_LIVE,
    OrderState.FILLED: frozenset(),
    OrderState.CANCELLED: frozenset(),
    OrderState.EXPIRED: frozenset(),
}
"""Allowed transitions: open -> partially filled -> filled | cancelled | expired."""


def can_transition(state: OrderState, target: OrderState) -> bool:
    """Return whether an order may move from `state` to `target`."""
    return target in TRANSITIONS[state]


def check_transition(order_id: str, state: OrderState, target: OrderState) -> None:
    """Raise `OrderStateError` unless an order may move from `state` to `target`."""
    if target not in TRANSITIONS[state]:
        raise OrderStateError(order_id, state.value, target.value)
