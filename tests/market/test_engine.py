"""Unit tests of the matching engine: placing, matching rules, cancel, expiry, queries."""

from __future__ import annotations

import pytest

from market.engine import Fill, MatchingEngine, OrderState, PriceLevel, Side
from market.errors import (
    DuplicateOrderError,
    MarketError,
    OrderExpiredError,
    OrderStateError,
    UnknownOrderError,
)
from tests.market.builders import GIB, NOW, ask, bid


@pytest.fixture
def engine() -> MatchingEngine:
    """Return an empty engine."""
    return MatchingEngine()


def trades(fills: list[Fill]) -> list[tuple[str, str, int, int]]:
    """Return (bid id, ask id, price, quantity) of each fill."""
    return [(f.bid_id, f.ask_id, f.price, f.quantity) for f in fills]


# -- resting and crossing ----------------------------------------------------------------------


def test_place_when_book_is_empty_then_order_rests_open(engine: MatchingEngine) -> None:
    assert engine.place(bid("b1"), now=NOW) == []
    record = engine.record("b1")
    assert record.state is OrderState.OPEN
    assert record.remaining == 10
    assert record.seq == 1
    assert engine.best_bid("tpu-v5e") == 100
    assert engine.best_ask("tpu-v5e") is None


def test_place_when_bid_crosses_ask_then_trades_at_resting_price(engine: MatchingEngine) -> None:
    engine.place(ask("a1", price=90), now=NOW)
    fills = engine.place(bid("b1", price=120), now=NOW)
    assert trades(fills) == [("b1", "a1", 90, 10)]
    assert fills[0].aggressor is Side.BID
    assert fills[0].maker_id == "a1"
    assert fills[0].taker_id == "b1"
    assert fills[0].time == NOW


def test_place_when_ask_crosses_bid_then_trades_at_resting_bid_price(
    engine: MatchingEngine,
) -> None:
    engine.place(bid("b1", price=120), now=NOW)
    fills = engine.place(ask("a1", price=90), now=NOW)
    assert trades(fills) == [("b1", "a1", 120, 10)]
    assert fills[0].aggressor is Side.ASK
    assert fills[0].maker_id == "b1"


def test_place_when_prices_touch_then_trades(engine: MatchingEngine) -> None:
    engine.place(ask("a1", price=100), now=NOW)
    assert trades(engine.place(bid("b1", price=100), now=NOW)) == [("b1", "a1", 100, 10)]


def test_place_when_prices_do_not_cross_then_both_rest(engine: MatchingEngine) -> None:
    engine.place(ask("a1", price=101), now=NOW)
    assert engine.place(bid("b1", price=100), now=NOW) == []
    assert engine.best_bid("tpu-v5e") == 100
    assert engine.best_ask("tpu-v5e") == 101


def test_place_when_taker_is_larger_then_fills_maker_and_rests_remainder(
    engine: MatchingEngine,
) -> None:
    engine.place(ask("a1", quantity=4), now=NOW)
    fills = engine.place(bid("b1", quantity=10), now=NOW)
    assert trades(fills) == [("b1", "a1", 100, 4)]
    assert engine.record("a1").state is OrderState.FILLED
    taker = engine.record("b1")
    assert (taker.state, taker.remaining, taker.filled) == (OrderState.PARTIALLY_FILLED, 6, 4)
    assert engine.depth("tpu-v5e", Side.BID) == [PriceLevel(100, 6, 1)]
    assert engine.depth("tpu-v5e", Side.ASK) == []


def test_place_when_maker_is_larger_then_maker_is_partially_filled(
    engine: MatchingEngine,
) -> None:
    engine.place(ask("a1", quantity=10), now=NOW)
    engine.place(bid("b1", quantity=3), now=NOW)
    maker = engine.record("a1")
    assert (maker.state, maker.remaining) == (OrderState.PARTIALLY_FILLED, 7)
    assert engine.record("b1").state is OrderState.FILLED
    assert engine.depth("tpu-v5e", Side.ASK) == [PriceLevel(100, 7, 1)]


def test_place_when_several_levels_cross_then_fills_best_price_first(
    engine: MatchingEngine,
) -> None:
    engine.place(ask("a-high", price=105, quantity=5), now=NOW)
    engine.place(ask("a-low", price=95, quantity=5), now=NOW)
    engine.place(ask("a-mid", price=100, quantity=5), now=NOW)
    fills = engine.place(bid("b1", price=110, quantity=12), now=NOW)
    assert trades(fills) == [
        ("b1", "a-low", 95, 5),
        ("b1", "a-mid", 100, 5),
        ("b1", "a-high", 105, 2),
    ]


def test_place_when_ask_sweeps_bids_then_fills_highest_bid_first(
    engine: MatchingEngine,
) -> None:
    engine.place(bid("b-low", price=90, quantity=5), now=NOW)
    engine.place(bid("b-high", price=110, quantity=5), now=NOW)
    fills = engine.place(ask("a1", price=80, quantity=8), now=NOW)
    assert trades(fills) == [("b-high", "a1", 110, 5), ("b-low", "a1", 90, 3)]


def test_place_when_same_price_then_earlier_order_fills_first(engine: MatchingEngine) -> None:
    for name in ("a1", "a2", "a3"):
        engine.place(ask(name, quantity=4), now=NOW)
    fills = engine.place(bid("b1", quantity=6), now=NOW)
    assert trades(fills) == [("b1", "a1", 100, 4), ("b1", "a2", 100, 2)]


def test_place_when_limit_reached_then_stops_before_worse_levels(
    engine: MatchingEngine,
) -> None:
    engine.place(ask("a1", price=100, quantity=2), now=NOW)
    engine.place(ask("a2", price=101, quantity=2), now=NOW)
    fills = engine.place(bid("b1", price=100, quantity=5), now=NOW)
    assert trades(fills) == [("b1", "a1", 100, 2)]
    assert engine.record("a2").state is OrderState.OPEN
    assert engine.best_bid("tpu-v5e") == 100


def test_place_when_device_classes_differ_then_no_trade(engine: MatchingEngine) -> None:
    engine.place(ask("a1", device_class="cpu"), now=NOW)
    assert engine.place(bid("b1", device_class="tpu-v5e"), now=NOW) == []
    assert engine.device_classes() == ["cpu", "tpu-v5e"]


def test_fill_ids_are_consecutive_across_places(engine: MatchingEngine) -> None:
    engine.place(ask("a1", quantity=1), now=NOW)
    engine.place(ask("a2", quantity=1), now=NOW)
    first = engine.place(bid("b1", quantity=2), now=NOW)
    engine.place(ask("a3", quantity=1), now=NOW)
    second = engine.place(bid("b2", quantity=1), now=NOW)
    assert [f.fill_id for f in first + second] == [1, 2, 3]
    assert engine.next_fill_id == 4


def test_sequence_numbers_follow_placement_order(engine: MatchingEngine) -> None:
    engine.place(ask("a1"), now=NOW)
    engine.place(bid("b1", price=1), now=NOW)
    engine.place(ask("a2", device_class="cpu"), now=NOW)
    assert [engine.record(i).seq for i in ("a1", "b1", "a2")] == [1, 2, 3]
    assert engine.next_seq == 4


# -- constraints -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("ask_fields", "bid_fields", "trades_expected"),
    [
        pytest.param({"slo_ms": 100}, {"slo_ms": 100}, True, id="slo-equal"),
        pytest.param({"slo_ms": 50}, {"slo_ms": 100}, True, id="slo-better-than-required"),
        pytest.param({"slo_ms": 101}, {"slo_ms": 100}, False, id="slo-worse-than-required"),
        pytest.param({"memory": 16 * GIB}, {"memory": 16 * GIB}, True, id="memory-equal"),
        pytest.param({"memory": 32 * GIB}, {"memory": 16 * GIB}, True, id="memory-more"),
        pytest.param({"memory": 8 * GIB}, {"memory": 16 * GIB}, False, id="memory-less"),
        pytest.param({"plan": "flat"}, {"plan": "metered"}, False, id="plan-differs"),
    ],
)
def test_place_when_constraints_are_checked_then_trades_only_if_compatible(
    engine: MatchingEngine,
    ask_fields: dict[str, object],
    bid_fields: dict[str, object],
    trades_expected: bool,
) -> None:
    engine.place(ask("a1", **ask_fields), now=NOW)
    fills = engine.place(bid("b1", **bid_fields), now=NOW)
    assert bool(fills) is trades_expected


def test_place_when_earliest_ask_is_incompatible_then_skips_to_next_compatible(
    engine: MatchingEngine,
) -> None:
    engine.place(ask("a-slow", slo_ms=500), now=NOW)
    engine.place(ask("a-fast", slo_ms=50), now=NOW)
    fills = engine.place(bid("b1", slo_ms=100), now=NOW)
    assert trades(fills) == [("b1", "a-fast", 100, 10)]
    assert engine.record("a-slow").state is OrderState.OPEN


def test_place_when_better_priced_ask_is_incompatible_then_trades_at_worse_compatible_price(
    engine: MatchingEngine,
) -> None:
    engine.place(ask("a-small", price=90, memory=8 * GIB), now=NOW)
    engine.place(ask("a-big", price=95, memory=64 * GIB), now=NOW)
    fills = engine.place(bid("b1", price=100, memory=32 * GIB), now=NOW)
    assert trades(fills) == [("b1", "a-big", 95, 10)]


def test_place_when_only_incompatible_asks_cross_then_bid_rests_above_them(
    engine: MatchingEngine,
) -> None:
    engine.place(ask("a1", price=90, plan="flat"), now=NOW)
    assert engine.place(bid("b1", price=100, plan="metered"), now=NOW) == []
    assert engine.best_bid("tpu-v5e") == 100
    assert engine.best_ask("tpu-v5e") == 90
    assert engine.best_bid("tpu-v5e", plan="flat") is None
    assert engine.best_ask("tpu-v5e", plan="flat") == 90
    assert engine.plans("tpu-v5e") == ["flat", "metered"]


def test_place_when_incompatible_orders_sit_ahead_then_priority_holds_after_compaction(
    engine: MatchingEngine,
) -> None:
    # One price level: an incompatible ask first, then many compatible ones. Filling the
    # compatible ones leaves dead entries behind the incompatible head until compaction.
    engine.place(ask("a-slow", slo_ms=900, quantity=1), now=NOW)
    for i in range(200):
        engine.place(ask(f"a{i:03}", quantity=1), now=NOW)
    for i in range(150):
        assert trades(engine.place(bid(f"b{i}", quantity=1), now=NOW)) == [
            (f"b{i}", f"a{i:03}", 100, 1)
        ]
    assert engine.depth("tpu-v5e", Side.ASK) == [PriceLevel(100, 51, 51)]
    fills = engine.place(bid("b-rest", quantity=60), now=NOW)
    assert [f.ask_id for f in fills] == [f"a{i:03}" for i in range(150, 200)]
    assert engine.record("a-slow").state is OrderState.OPEN


# -- expiry -----------------------------------------------------------------------------------


def test_place_when_order_already_expired_then_raises(engine: MatchingEngine) -> None:
    with pytest.raises(OrderExpiredError) as info:
        engine.place(bid("b1", expiry=NOW), now=NOW)
    assert info.value.order_id == "b1"
    assert "b1" not in engine


def test_place_when_resting_order_expired_then_skips_it_until_expire_sweeps(
    engine: MatchingEngine,
) -> None:
    engine.place(ask("a-old", price=90, expiry=NOW + 5), now=NOW)
    engine.place(ask("a-new", price=95), now=NOW)
    fills = engine.place(bid("b1"), now=NOW + 5)
    assert trades(fills) == [("b1", "a-new", 95, 10)]
    assert engine.record("a-old").state is OrderState.OPEN
    expired = engine.expire(NOW + 5)
    assert [r.order_id for r in expired] == ["a-old"]
    assert expired[0].state is OrderState.EXPIRED
    assert expired[0].expired_quantity == 10
    assert engine.best_ask("tpu-v5e") is None


def test_expire_when_orders_are_due_then_expires_them_by_expiry_then_sequence(
    engine: MatchingEngine,
) -> None:
    engine.place(bid("b1", expiry=NOW + 20), now=NOW)
    engine.place(bid("b2", expiry=NOW + 10), now=NOW)
    engine.place(ask("a1", price=200, expiry=NOW + 10), now=NOW)
    engine.place(bid("b3", expiry=NOW + 30), now=NOW)
    assert engine.expire(NOW + 9) == []
    assert [r.order_id for r in engine.expire(NOW + 20)] == ["b2", "a1", "b1"]
    assert [r.order_id for r in engine.open_orders("tpu-v5e", Side.BID)] == ["b3"]


def test_expire_when_order_was_filled_or_cancelled_then_reports_nothing_and_forgets_it(
    engine: MatchingEngine,
) -> None:
    engine.place(ask("a1", expiry=NOW + 10), now=NOW)
    engine.place(ask("a2", price=150, expiry=NOW + 10), now=NOW)
    engine.place(bid("b1"), now=NOW)
    engine.cancel("a2")
    assert engine.expire(NOW + 9) == []
    assert engine.record("a1").state is OrderState.FILLED  # remembered until its expiry
    assert engine.record("a2").state is OrderState.CANCELLED
    assert engine.expire(NOW + 10) == []  # no state change to report
    assert "a1" not in engine and "a2" not in engine and "b1" in engine
    with pytest.raises(OrderExpiredError):  # a forgotten order can never come back
        engine.place(ask("a1", expiry=NOW + 10), now=NOW + 10)


def test_expire_forgets_every_order_past_its_expiry_so_memory_holds_the_window(
    engine: MatchingEngine,
) -> None:
    for i in range(1_000):  # rest, fill, cancel and expire orders over 1,000 seconds
        now = NOW + i
        engine.place(ask(f"a{i}", price=100 + i % 7, expiry=now + 30), now=now)
        engine.place(bid(f"b{i}", price=100 + i % 5, expiry=now + 30), now=now)
        if i % 3 == 0 and f"a{i}" in engine and engine.record(f"a{i}").state.is_live:
            engine.cancel(f"a{i}")
        engine.expire(now)
    assert len(engine) <= 2 * 31  # the orders of the last 30 seconds, not all 2,000
    assert {r.order_id for r in engine.records()} <= {
        f"{side}{i}" for side in "ab" for i in range(1_000 - 31, 1_000)
    }
    restored = MatchingEngine.restore(engine.snapshot())
    assert restored.records() == engine.records()


def test_release_when_orders_filled_or_cancelled_then_only_live_ones_stay_remembered(
    engine: MatchingEngine,
) -> None:
    engine.place(ask("a1", quantity=5, expiry=NOW + 10), now=NOW)
    engine.place(ask("a2", price=150, expiry=NOW + 20), now=NOW)
    engine.place(bid("b1", quantity=5), now=NOW)  # fills a1 and itself
    engine.place(bid("b2", price=90, quantity=3), now=NOW)
    engine.cancel("a2")
    assert engine.record("a1").state is OrderState.FILLED  # kept until released
    assert sorted(engine.release()) == ["a1", "a2", "b1"]
    assert engine.release() == []
    assert [r.order_id for r in engine.records()] == ["b2"]
    with pytest.raises(UnknownOrderError):
        engine.record("a1")
    restored = MatchingEngine.restore(engine.snapshot())
    assert restored.records() == engine.records()
    # What stays live trades on, in both, and an expiry after a release finds nothing stale.
    for e in (engine, restored):
        assert trades(e.place(ask("a3", price=90, quantity=3), now=NOW + 1)) == [
            ("b2", "a3", 90, 3)
        ]
        assert e.expire(NOW + 3_600) == []
        assert len(e) == 2  # b2 and a3: filled, not yet released


def test_release_when_many_orders_die_then_memory_follows_the_live_book(
    engine: MatchingEngine,
) -> None:
    for i in range(2_000):  # every pair fills at once, each with its own expiry
        engine.place(ask(f"a{i}", expiry=NOW + 100 + i), now=NOW)
        engine.place(bid(f"b{i}", expiry=NOW + 100 + i), now=NOW)
        engine.release()
    engine.place(bid("resting", price=1), now=NOW)
    assert len(engine) == 1
    assert len(engine.snapshot()["orders"]) == 1


def test_expire_when_partially_filled_then_expired_quantity_is_the_remainder(
    engine: MatchingEngine,
) -> None:
    engine.place(ask("a1", quantity=10, expiry=NOW + 10), now=NOW)
    engine.place(bid("b1", quantity=4), now=NOW)
    (record,) = engine.expire(NOW + 10)
    assert (record.filled, record.expired_quantity, record.open_quantity) == (4, 6, 0)


# -- cancel ------------------------------------------------------------------------------------


def test_cancel_when_open_then_cancelled_and_gone_from_depth(engine: MatchingEngine) -> None:
    engine.place(bid("b1", price=100), now=NOW)
    engine.place(bid("b2", price=99), now=NOW)
    record = engine.cancel("b1")
    assert record.state is OrderState.CANCELLED
    assert record.cancelled_quantity == 10
    assert engine.best_bid("tpu-v5e") == 99
    assert engine.depth("tpu-v5e", Side.BID) == [PriceLevel(99, 10, 1)]


def test_cancel_when_partially_filled_then_cancels_the_remainder(
    engine: MatchingEngine,
) -> None:
    engine.place(bid("b1", quantity=10), now=NOW)
    engine.place(ask("a1", quantity=3), now=NOW)
    record = engine.cancel("b1")
    assert (record.filled, record.cancelled_quantity) == (3, 7)


def test_cancel_when_order_in_middle_of_queue_then_others_keep_priority(
    engine: MatchingEngine,
) -> None:
    for name in ("a1", "a2", "a3"):
        engine.place(ask(name, quantity=1), now=NOW)
    engine.cancel("a2")
    fills = engine.place(bid("b1", quantity=2), now=NOW)
    assert [f.ask_id for f in fills] == ["a1", "a3"]


def test_cancel_when_many_orders_cancelled_behind_head_then_queue_stays_consistent(
    engine: MatchingEngine,
) -> None:
    for i in range(300):
        engine.place(ask(f"a{i:03}", quantity=1), now=NOW)
    # Cancelling two in three leaves dead entries behind the head until compaction.
    for i in range(300):
        if i % 3:
            engine.cancel(f"a{i:03}")
    assert engine.depth("tpu-v5e", Side.ASK) == [PriceLevel(100, 100, 100)]
    fills = engine.place(bid("b1", quantity=100), now=NOW)
    assert [f.ask_id for f in fills] == [f"a{i:03}" for i in range(0, 300, 3)]


def test_cancel_when_order_is_filled_then_raises_order_state_error(
    engine: MatchingEngine,
) -> None:
    engine.place(ask("a1"), now=NOW)
    engine.place(bid("b1"), now=NOW)
    with pytest.raises(OrderStateError) as info:
        engine.cancel("a1")
    assert (info.value.state, info.value.target) == ("filled", "cancelled")


def test_cancel_when_already_cancelled_then_raises(engine: MatchingEngine) -> None:
    engine.place(ask("a1"), now=NOW)
    engine.cancel("a1")
    with pytest.raises(OrderStateError):
        engine.cancel("a1")


def test_cancel_when_order_is_unknown_then_raises(engine: MatchingEngine) -> None:
    with pytest.raises(UnknownOrderError) as info:
        engine.cancel("nope")
    assert isinstance(info.value, LookupError)
    assert isinstance(info.value, MarketError)


def test_record_when_order_is_unknown_then_raises(engine: MatchingEngine) -> None:
    with pytest.raises(UnknownOrderError):
        engine.record("nope")


def test_place_when_id_is_duplicate_then_raises_and_state_is_unchanged(
    engine: MatchingEngine,
) -> None:
    engine.place(ask("a1"), now=NOW)
    before = engine.snapshot()
    with pytest.raises(DuplicateOrderError):
        engine.place(bid("a1"), now=NOW)
    assert engine.snapshot() == before


def test_place_when_id_was_filled_long_ago_then_still_duplicate(engine: MatchingEngine) -> None:
    engine.place(ask("a1"), now=NOW)
    engine.place(bid("b1"), now=NOW)
    with pytest.raises(DuplicateOrderError):
        engine.place(ask("a1"), now=NOW)


# -- queries -----------------------------------------------------------------------------------


def test_depth_sums_each_level_best_first_and_honours_limit(engine: MatchingEngine) -> None:
    engine.place(bid("b1", price=98, quantity=1), now=NOW)
    engine.place(bid("b2", price=99, quantity=2), now=NOW)
    engine.place(bid("b3", price=99, quantity=3, plan="flat"), now=NOW)
    engine.place(ask("a1", price=102, quantity=4), now=NOW)
    engine.place(ask("a2", price=101, quantity=5), now=NOW)
    assert engine.depth("tpu-v5e", Side.BID) == [PriceLevel(99, 5, 2), PriceLevel(98, 1, 1)]
    assert engine.depth("tpu-v5e", Side.BID, levels=1) == [PriceLevel(99, 5, 2)]
    assert engine.depth("tpu-v5e", Side.BID, plan="flat") == [PriceLevel(99, 3, 1)]
    assert engine.depth("tpu-v5e", Side.ASK) == [PriceLevel(101, 5, 1), PriceLevel(102, 4, 1)]
    assert engine.depth("cpu", Side.ASK) == []


def test_open_orders_lists_live_orders_in_priority_order_across_plans(
    engine: MatchingEngine,
) -> None:
    engine.place(bid("b1", price=98), now=NOW)
    engine.place(bid("b2", price=99, plan="flat"), now=NOW)
    engine.place(bid("b3", price=99), now=NOW)
    engine.place(bid("b4", price=97), now=NOW)
    engine.cancel("b4")
    assert [r.order_id for r in engine.open_orders("tpu-v5e", Side.BID)] == ["b2", "b3", "b1"]
    assert engine.open_orders("cpu", Side.BID) == []


def test_best_prices_when_device_class_unknown_then_none(engine: MatchingEngine) -> None:
    assert engine.best_bid("cpu") is None
    assert engine.best_ask("cpu") is None
    assert engine.device_classes() == []


def test_records_lists_every_order_in_sequence_order(engine: MatchingEngine) -> None:
    engine.place(ask("a1"), now=NOW)
    engine.place(bid("b1"), now=NOW)
    engine.place(bid("b2", price=1), now=NOW)
    states = [(r.order_id, r.state) for r in engine.records()]
    assert states == [
        ("a1", OrderState.FILLED),
        ("b1", OrderState.FILLED),
        ("b2", OrderState.OPEN),
    ]
    assert len(engine) == 3


def test_expiry_index_when_many_orders_die_early_then_expire_still_finds_live_ones(
    engine: MatchingEngine,
) -> None:
    # Enough resting orders to pass the expiry index's compaction threshold.
    for i in range(9_000):
        engine.place(bid(f"b{i}", price=1, expiry=NOW + 100), now=NOW)
        if i % 10:
            engine.cancel(f"b{i}")
    expired = engine.expire(NOW + 100)
    assert [r.order_id for r in expired] == [f"b{i}" for i in range(0, 9_000, 10)]
