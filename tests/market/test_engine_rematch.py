"""Matching again what a gate held back: resting orders that cross trade once the gate lets
them, with no new order, and what is left keeps its place in time priority."""

from __future__ import annotations

from market.engine import Fill, MatchingEngine, Side
from tests.market.builders import NOW, ask, bid

P, Q, R, C = ("0x" + digit * 40 for digit in "1234")  # three providers and a client


class Gate:
    """The engine's gate as the market answers it: providers' liveness and owners' budgets."""

    def __init__(self, dead: set[str] | None = None, budgets: dict[str, int] | None = None):
        self.dead = dead or set()
        self.budgets = budgets or {}

    def ask_live(self, owner: str) -> bool:
        return owner not in self.dead

    def bid_units(self, owner: str, price: int, units: int) -> int:
        budget = self.budgets.get(owner)
        if budget is None:
            return units
        take = min(units, budget // price)
        self.budgets[owner] = budget - take * price
        return take


def trades(fills: list[Fill]) -> list[tuple[str, str, int, int]]:
    return [(f.bid_id, f.ask_id, f.price, f.quantity) for f in fills]


def test_ask_of_a_silent_provider_trades_once_its_provider_is_back() -> None:
    engine = MatchingEngine()
    silent = Gate(dead={P})
    assert engine.place(ask("a1", owner=P, price=100, quantity=5), now=NOW, gate=silent) == []
    assert engine.place(bid("b1", price=120, quantity=3), now=NOW, gate=silent) == []
    assert engine.rematch(NOW, silent) == []  # still silent: nothing trades, nothing moves

    fills = engine.rematch(NOW + 1, Gate())

    assert trades(fills) == [("b1", "a1", 120, 3)]  # the ask came back: the bid's price
    assert engine.record("a1").remaining == 2
    assert engine.record("b1").state.value == "filled"
    assert engine.rematch(NOW + 1, Gate()) == []  # nothing crosses any more


def test_bid_whose_owner_could_not_pay_trades_once_funded_up_to_its_budget() -> None:
    engine = MatchingEngine()
    broke = Gate(budgets={C: 0})
    engine.place(ask("a1", price=100, quantity=5), now=NOW, gate=broke)
    assert engine.place(bid("b1", owner=C, price=100, quantity=4), now=NOW, gate=broke) == []

    fills = engine.rematch(NOW, Gate(budgets={C: 250}))  # a deposit: two units' worth

    assert trades(fills) == [("b1", "a1", 100, 2)]
    assert engine.record("b1").remaining == 2
    next_fill = engine.place(bid("b2", price=100, quantity=1), now=NOW, gate=Gate())
    assert [f.fill_id for f in fills + next_fill] == [1, 2]  # fill ids go on


def test_an_order_matched_again_without_trading_keeps_its_place_in_time_priority() -> None:
    engine = MatchingEngine()
    gate = Gate(dead={P})
    engine.place(ask("a1", owner=P, price=100, quantity=5), now=NOW, gate=gate)
    engine.place(ask("a2", owner=Q, price=100, quantity=5), now=NOW, gate=gate)
    engine.place(ask("a3", owner=R, price=100, quantity=5), now=NOW, gate=gate)
    # An incompatible bid crosses them (it needs more memory than any offers): it rests.
    engine.place(bid("b1", price=100, quantity=1, memory=10**15), now=NOW, gate=gate)

    assert engine.rematch(NOW, gate) == []

    assert [r.order_id for r in engine.open_orders("tpu-v5e", Side.ASK)] == ["a1", "a2", "a3"]
    assert engine.depth("tpu-v5e", Side.ASK)[0].quantity == 15
    fills = engine.place(bid("b2", price=100, quantity=6), now=NOW, gate=Gate())
    assert trades(fills) == [("b2", "a1", 100, 5), ("b2", "a2", 100, 1)]  # a1 first, as before


def test_rematch_skips_expired_orders_and_an_engine_without_a_gate_has_nothing_crossed() -> None:
    engine = MatchingEngine()
    engine.place(
        ask("a1", owner=P, price=100, quantity=5, expiry=NOW + 5),
        now=NOW,
        gate=Gate(dead={P}),
    )
    engine.place(bid("b1", price=100, quantity=1), now=NOW, gate=Gate(dead={P}))
    assert engine.rematch(NOW + 5, Gate()) == []  # a1 expired at NOW + 5: it trades no more

    plain = MatchingEngine()
    plain.place(ask("a1", price=100, quantity=5), now=NOW)
    plain.place(bid("b1", price=100, quantity=1), now=NOW)
    assert plain.rematch(NOW) == []
