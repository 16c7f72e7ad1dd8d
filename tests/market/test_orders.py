"""Tests of orders, the compatibility rule, the lifecycle state machine and the errors."""

from __future__ import annotations

import pytest

from market import errors
from market.engine import (
    LIVE_STATES,
    TERMINAL_STATES,
    TRANSITIONS,
    OrderRecord,
    OrderState,
    Side,
    can_transition,
    check_transition,
    compatible,
)
from tests.market.builders import GIB, ask, bid


@pytest.mark.parametrize(
    ("field", "value", "error"),
    [
        ("quantity", 0, errors.InvalidQuantityError),
        ("quantity", -3, errors.InvalidQuantityError),
        ("quantity", 1.5, errors.InvalidQuantityError),
        ("quantity", True, errors.InvalidQuantityError),
        ("price", 0, errors.InvalidPriceError),
        ("price", -1, errors.InvalidPriceError),
        ("price", "100", errors.InvalidPriceError),
        ("slo_ms", 0, errors.InvalidOrderError),
        ("memory", -1, errors.InvalidOrderError),
        ("expiry", -1, errors.InvalidOrderError),
        ("order_id", "", errors.InvalidOrderError),
        ("owner", "", errors.InvalidOrderError),
        ("device_class", "", errors.InvalidOrderError),
        ("plan", "", errors.InvalidOrderError),
        ("plan", None, errors.InvalidOrderError),
        ("side", "bid", errors.InvalidOrderError),
    ],
)
def test_order_when_field_is_invalid_then_raises_typed_error(
    field: str, value: object, error: type[errors.InvalidOrderError]
) -> None:
    with pytest.raises(error) as info:
        bid("b1", **{field: value})
    assert info.value.field == field
    assert isinstance(info.value, ValueError)
    assert isinstance(info.value, errors.MarketError)


def test_order_when_memory_is_zero_then_valid() -> None:
    assert bid("b1", memory=0).memory == 0


def test_order_is_frozen() -> None:
    order = bid("b1")
    with pytest.raises(AttributeError, match="immutable"):
        order.price = 1  # type: ignore[misc]


def test_side_opposite_swaps_bid_and_ask() -> None:
    assert Side.BID.opposite is Side.ASK
    assert Side.ASK.opposite is Side.BID


@pytest.mark.parametrize(
    ("ask_fields", "bid_fields", "expected"),
    [
        ({}, {}, True),
        ({"slo_ms": 99}, {"slo_ms": 100}, True),
        ({"slo_ms": 101}, {"slo_ms": 100}, False),
        ({"memory": 17 * GIB}, {"memory": 16 * GIB}, True),
        ({"memory": 15 * GIB}, {"memory": 16 * GIB}, False),
        ({"memory": 0}, {"memory": 0}, True),
        ({"plan": "flat"}, {"plan": "flat"}, True),
        ({"plan": "flat"}, {"plan": "tiered"}, False),
    ],
)
def test_compatible_when_constraints_vary_then_requires_slo_memory_and_plan_to_fit(
    ask_fields: dict[str, object], bid_fields: dict[str, object], expected: bool
) -> None:
    assert compatible(bid("b", **bid_fields), ask("a", **ask_fields)) is expected


def test_compatible_ignores_price_and_quantity() -> None:
    assert compatible(bid("b", price=1, quantity=1), ask("a", price=999, quantity=50))


# -- lifecycle ----------------------------------------------------------------------------------


def test_lifecycle_when_terminal_then_no_transition_leaves_it() -> None:
    for state in TERMINAL_STATES:
        assert TRANSITIONS[state] == frozenset()
        assert not state.is_live


def test_lifecycle_when_live_then_may_fill_partially_fully_cancel_or_expire() -> None:
    targets = {
        OrderState.PARTIALLY_FILLED,
        OrderState.FILLED,
        OrderState.CANCELLED,
        OrderState.EXPIRED,
    }
    for state in LIVE_STATES:
        assert TRANSITIONS[state] == targets
        assert state.is_live


def test_lifecycle_never_returns_to_open() -> None:
    assert all(not can_transition(s, OrderState.OPEN) for s in OrderState)


def test_lifecycle_covers_every_state() -> None:
    assert set(TRANSITIONS) == set(OrderState)
    assert set(OrderState) == LIVE_STATES | TERMINAL_STATES
    assert not LIVE_STATES & TERMINAL_STATES


def test_check_transition_when_not_allowed_then_raises_order_state_error() -> None:
    check_transition("o1", OrderState.OPEN, OrderState.FILLED)
    with pytest.raises(errors.OrderStateError) as info:
        check_transition("o1", OrderState.EXPIRED, OrderState.CANCELLED)
    assert (info.value.order_id, info.value.state, info.value.target) == (
        "o1",
        "expired",
        "cancelled",
    )


@pytest.mark.parametrize(
    ("state", "remaining", "quantities"),
    [
        (OrderState.OPEN, 10, (0, 10, 0, 0)),
        (OrderState.PARTIALLY_FILLED, 4, (6, 4, 0, 0)),
        (OrderState.FILLED, 0, (10, 0, 0, 0)),
        (OrderState.CANCELLED, 7, (3, 0, 7, 0)),
        (OrderState.EXPIRED, 2, (8, 0, 0, 2)),
    ],
)
def test_order_record_splits_quantity_into_filled_open_cancelled_expired(
    state: OrderState, remaining: int, quantities: tuple[int, int, int, int]
) -> None:
    record = OrderRecord(bid("b1", quantity=10), 1, state, remaining)
    got = (
        record.filled,
        record.open_quantity,
        record.cancelled_quantity,
        record.expired_quantity,
    )
    assert got == quantities
    assert sum(got) == 10
    assert record.order_id == "b1"


# -- errors -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("error", "builtin"),
    [
        (errors.InvalidOrderError("f", 1, "bad"), ValueError),
        (errors.InvalidQuantityError(0), ValueError),
        (errors.InvalidPriceError(0), ValueError),
        (errors.OrderExpiredError("o", 1, 2), ValueError),
        (errors.DuplicateOrderError("o"), ValueError),
        (errors.UnknownOrderError("o"), LookupError),
        (errors.OrderStateError("o", "filled", "cancelled"), ValueError),
        (errors.SnapshotError("bad"), ValueError),
    ],
)
def test_errors_derive_from_market_error_and_a_builtin(
    error: errors.MarketError, builtin: type[Exception]
) -> None:
    assert isinstance(error, errors.MarketError)
    assert isinstance(error, builtin)
    assert str(error)
