"""Property tests of the matching engine against a naive reference model.

The stateful machine drives the engine and the model (tests/market/model.py) with the same
random places, cancels, clock moves, expiries and restarts, and checks after every step:
identical fills and order states, a never-crossed book, conserved quantities, price-time
priority, and depth that agrees with the open orders.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import pairwise

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
)

from market.engine import (
    Fill,
    MatchingEngine,
    Order,
    OrderRecord,
    OrderState,
    PriceLevel,
    Side,
    compatible,
)
from market.errors import MarketError
from tests.market.model import ModelEngine

DEVICE_CLASSES = ("tpu-v5e", "cpu")
START = 1_000

# Small domains, mostly compatible values, so that orders collide: equal prices, crossing
# books, and now and then an incompatible order that matching has to skip.
order_params = st.fixed_dictionaries(
    {
        "side": st.sampled_from(Side),
        "device_class": st.sampled_from(("tpu-v5e", "tpu-v5e", "tpu-v5e", "cpu")),
        "quantity": st.integers(1, 6),
        "price": st.integers(1, 5),
        "plan": st.sampled_from(("metered", "metered", "metered", "flat")),
        "slo_ms": st.sampled_from((100, 100, 100, 50, 200)),
        "memory": st.sampled_from((16, 16, 16, 0, 32)),
        "ttl": st.integers(1, 8),
    }
)


def make_order(order_id: str, params: dict[str, object], now: int) -> Order:
    """Build an order from drawn parameters, expiring `ttl` seconds after `now`."""
    fields = dict(params)
    ttl = fields.pop("ttl")
    assert isinstance(ttl, int)
    return Order(order_id=order_id, owner="0xowner", expiry=now + ttl, **fields)  # type: ignore[arg-type]


def better(side: Side, a: OrderRecord, b: OrderRecord) -> bool:
    """Return whether resting order `a` has priority over `b` on `side`."""
    if a.order.price != b.order.price:
        if side is Side.BID:
            return a.order.price > b.order.price
        return a.order.price < b.order.price
    return a.seq < b.seq


def can_trade(taker: Order, maker: Order, now: int) -> bool:
    """Return whether resting `maker` is live at `now`, compatible and crossing `taker`."""
    if maker.expiry <= now:
        return False
    if taker.side is Side.BID:
        return maker.price <= taker.price and compatible(taker, maker)
    return maker.price >= taker.price and compatible(maker, taker)


class EngineMachine(RuleBasedStateMachine):
    """Drive the engine and the model with the same operations and compare them."""

    placed = Bundle("placed")

    def __init__(self) -> None:
        """Start both with empty books."""
        super().__init__()
        self.engine = MatchingEngine()
        self.model = ModelEngine()
        self.now = START
        self.count = 0
        self.filled: Counter[str] = Counter()
        self.fills: list[Fill] = []
        self.forgotten: dict[str, OrderRecord] = {}  # final records of orders the engine forgot

    @rule(target=placed, params=order_params)
    def place(self, params: dict[str, object]) -> str:
        """Place a fresh order in both; fills must agree and respect priority."""
        order_id = f"o{self.count}"
        self.count += 1
        order = make_order(order_id, params, self.now)
        resting = self.engine.open_orders(order.device_class, order.side.opposite)
        fills = self.engine.place(order, now=self.now)
        assert fills == self.model.place(order, self.now)
        self._check_priority(order, resting, fills)
        for f in fills:
            assert f.price == self.engine.record(f.maker_id).order.price
            self.filled[f.bid_id] += f.quantity
            self.filled[f.ask_id] += f.quantity
        self.fills.extend(fills)
        return order_id

    @rule(params=order_params)
    def place_more(self, params: dict[str, object]) -> None:
        """Place another order (a second rule so that placing dominates the mix)."""
        self.place(params)

    def _check_priority(self, taker: Order, resting: list[OrderRecord], fills: list[Fill]) -> None:
        # A fill never skips a better-priced or earlier compatible resting order: every such
        # order ahead of a maker must have been used up by this same placement.
        side = taker.side.opposite
        by_id = {r.order_id: r for r in resting}
        for f in fills:
            maker = by_id[f.maker_id]
            assert can_trade(taker, maker.order, self.now)
            for other in resting:
                if can_trade(taker, other.order, self.now) and better(side, other, maker):
                    assert self.engine.record(other.order_id).state is OrderState.FILLED

    @rule(order_id=placed | st.just("never-placed"))
    def cancel(self, order_id: str) -> None:
        """Cancel an order in both; outcome (record or error type) must agree."""
        self._same_outcome(
            lambda: self.engine.cancel(order_id), lambda: self.model.cancel(order_id)
        )

    @rule(params=order_params)
    def place_again(self, params: dict[str, object]) -> None:
        """Place the same id twice: both accept the first, reject the second, state unchanged."""
        self.place(params)
        order_id = f"o{self.count - 1}"
        before = self.engine.snapshot()
        order = make_order(order_id, params, self.now)
        self._same_outcome(
            lambda: self.engine.place(order, now=self.now),
            lambda: self.model.place(order, self.now),
        )
        late = make_order(f"o{self.count}", params, self.now - 20)
        self._same_outcome(
            lambda: self.engine.place(late, now=self.now), lambda: self.model.place(late, self.now)
        )
        assert self.engine.snapshot() == before

    @rule(seconds=st.integers(0, 3))
    def tick(self, seconds: int) -> None:
        """Move the clock without sweeping: expired orders linger but must not trade."""
        self.now += seconds

    @rule(seconds=st.integers(0, 3))
    def expire(self, seconds: int) -> None:
        """Move the clock and sweep expiries in both."""
        self.now += seconds
        due = {r.order_id: r for r in self.engine.records() if r.order.expiry <= self.now}
        expired = self.engine.expire(self.now)
        assert [r.order_id for r in expired] == self.model.expire(self.now)
        assert all(r.state is OrderState.EXPIRED and r.order.expiry <= self.now for r in expired)
        # Every order past its expiry is forgotten, with its final record as reported or as it
        # was; none that is not yet due.
        due.update({r.order_id: r for r in expired})
        assert all(order_id not in self.engine for order_id in due)
        assert all(r.order.expiry > self.now for r in self.engine.records())
        self.forgotten.update(due)

    @precondition(lambda self: self.count > 0)
    @rule()
    def restart(self) -> None:
        """Replace the engine by one restored from its JSON snapshot."""
        snap = self.engine.snapshot()
        self.engine = MatchingEngine.restore(json.loads(json.dumps(snap)))
        assert self.engine.snapshot() == snap

    def _same_outcome(
        self, engine_call: Callable[[], object], model_call: Callable[[], object]
    ) -> None:
        results: list[object] = []
        for call in (engine_call, model_call):
            try:
                call()
                results.append(None)
            except MarketError as exc:
                results.append(type(exc))
        assert results[0] == results[1], results

    # -- invariants ---------------------------------------------------------------------------

    @invariant()
    def states_match_model(self) -> None:
        """Every order has the model's sequence number, state and remaining units."""
        got = [(r.order_id, r.seq, r.state, r.remaining) for r in self.engine.records()]
        assert got == self.model.states()
        assert self.engine.next_fill_id == self.model.next_fill_id

    @invariant()
    def book_is_never_crossed(self) -> None:
        """No live compatible bid/ask pair has bid price >= ask price."""
        for device_class in DEVICE_CLASSES:
            bids = [r.order for r in self.engine.open_orders(device_class, Side.BID)]
            asks = [r.order for r in self.engine.open_orders(device_class, Side.ASK)]
            for b in bids:
                for a in asks:
                    if b.expiry > self.now and a.expiry > self.now and compatible(b, a):
                        assert b.price < a.price, (b, a)

    @invariant()
    def quantities_are_conserved(self) -> None:
        """Filled + open + cancelled + expired = placed, per order and in total."""
        totals = Counter[str]()
        for r in [*self.engine.records(), *self.forgotten.values()]:
            parts = (r.filled, r.open_quantity, r.cancelled_quantity, r.expired_quantity)
            assert all(p >= 0 for p in parts)
            assert sum(parts) == r.order.quantity
            assert r.filled == self.filled[r.order_id]
            totals["placed"] += r.order.quantity
            totals["accounted"] += sum(parts)
            totals[r.order.side.value] += r.filled
        assert totals["placed"] == totals["accounted"]
        # Every unit traded has one buyer and one seller.
        assert totals["bid"] == totals["ask"] == sum(f.quantity for f in self.fills)

    @invariant()
    def depth_agrees_with_open_orders(self) -> None:
        """Depth, best prices and open orders describe the same book, best first."""
        for device_class in DEVICE_CLASSES:
            for side in Side:
                records = self.engine.open_orders(device_class, side)
                assert all(r.state.is_live for r in records)
                assert all(better(side, a, b) for a, b in pairwise(records))
                levels: dict[int, list[int]] = {}
                for r in records:
                    level = levels.setdefault(r.order.price, [0, 0])
                    level[0] += r.remaining
                    level[1] += 1
                expected = [PriceLevel(p, q, n) for p, (q, n) in levels.items()]
                depth = self.engine.depth(device_class, side)
                assert depth == expected
                best = self.engine.best_bid if side is Side.BID else self.engine.best_ask
                assert best(device_class) == (depth[0].price if depth else None)


# `make test` runs 100 sequences of 60 operations (~6,000 steps); a long run sets more, e.g.
# MARKET_ENGINE_EXAMPLES=2000 .venv/bin/pytest tests/market/test_engine_properties.py
ENGINE_EXAMPLES = int(os.environ.get("MARKET_ENGINE_EXAMPLES", "100"))
EngineMachine.TestCase.settings = settings(
    max_examples=ENGINE_EXAMPLES,
    stateful_step_count=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestEngineMachine = EngineMachine.TestCase


# -- whole-sequence properties ----------------------------------------------------------------


operations = st.lists(
    st.one_of(
        st.tuples(st.just("place"), order_params),
        st.tuples(st.just("cancel"), st.integers(0, 50)),
        st.tuples(st.just("expire"), st.integers(0, 4)),
        st.tuples(st.just("tick"), st.integers(0, 4)),
    ),
    max_size=60,
)


@dataclass
class Driver:
    """Apply operations to an engine, recording every observable outcome."""

    engine: MatchingEngine
    now: int = START
    ids: list[str] = field(default_factory=list)
    outcomes: list[object] = field(default_factory=list)

    def apply(self, op: tuple[str, object]) -> None:
        """Apply one operation; a cancel picks a placed id by index (or an unknown id)."""
        kind, arg = op
        try:
            if kind == "place":
                assert isinstance(arg, dict)
                order = make_order(f"o{len(self.ids)}", arg, self.now)
                self.ids.append(order.order_id)
                self.outcomes.append(self.engine.place(order, now=self.now))
            elif kind == "cancel":
                assert isinstance(arg, int)
                target = self.ids[arg] if arg < len(self.ids) else f"x{arg}"
                self.outcomes.append(self.engine.cancel(target))
            else:
                assert isinstance(arg, int)
                self.now += arg
                if kind == "expire":
                    self.outcomes.append(self.engine.expire(self.now))
        except MarketError as exc:
            self.outcomes.append(type(exc))


@settings(max_examples=300, deadline=None)
@given(ops=operations)
def test_same_operations_twice_then_same_fills_and_state(ops: list[tuple[str, object]]) -> None:
    first, second = Driver(MatchingEngine()), Driver(MatchingEngine())
    for op in ops:
        first.apply(op)
        second.apply(op)
    assert first.outcomes == second.outcomes
    assert first.engine.snapshot() == second.engine.snapshot()


@settings(max_examples=300, deadline=None)
@given(ops=operations, data=st.data())
def test_restore_at_any_point_then_identical_subsequent_fills(
    ops: list[tuple[str, object]], data: st.DataObject
) -> None:
    cut = data.draw(st.integers(0, len(ops)), label="cut")
    original = Driver(MatchingEngine())
    for op in ops[:cut]:
        original.apply(op)
    snap = json.loads(json.dumps(original.engine.snapshot()))
    restored = Driver(MatchingEngine.restore(snap), now=original.now, ids=list(original.ids))
    assert restored.engine.snapshot() == original.engine.snapshot()
    original.outcomes.clear()
    for op in ops[cut:]:
        original.apply(op)
        restored.apply(op)
    assert restored.outcomes == original.outcomes
    assert restored.engine.snapshot() == original.engine.snapshot()


@settings(max_examples=300, deadline=None)
@given(ops=operations)
def test_any_sequence_then_fills_equal_the_reference_model(ops: list[tuple[str, object]]) -> None:
    driver = Driver(MatchingEngine())
    model = ModelEngine()
    for op in ops:
        before = len(driver.outcomes)
        kind, arg = op
        if kind == "place":
            assert isinstance(arg, dict)
            order = make_order(f"o{len(driver.ids)}", arg, driver.now)
            driver.apply(op)
            assert driver.outcomes[before] == model.place(order, driver.now)
        elif kind == "cancel":
            assert isinstance(arg, int)
            driver.apply(op)
            target = driver.ids[arg] if arg < len(driver.ids) else f"x{arg}"
            try:
                model.cancel(target)
                assert isinstance(driver.outcomes[before], OrderRecord)
            except MarketError as exc:
                assert driver.outcomes[before] is type(exc)
        else:
            driver.apply(op)
            if kind == "expire":
                expired = driver.outcomes[before]
                assert isinstance(expired, list)
                assert [r.order_id for r in expired] == model.expire(driver.now)
    got = [(r.order_id, r.seq, r.state, r.remaining) for r in driver.engine.records()]
    assert got == model.states()
