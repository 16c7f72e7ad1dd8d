"""Persistence over both SQL backends: restart restores the book exactly; no order is accepted
and then lost."""

from __future__ import annotations

import random
from typing import Any

import pytest

from market import storage
from market.models import OrderCreate
from market.service import MarketService
from market.settings import Settings

from .conftest import START, Clock
from .signing import Trader


def _random_session(service: MarketService, clock: Clock, rng: random.Random) -> int:
    """Drive a service through places, cancels and expiries; return the number of fills."""
    traders = [Trader() for _ in range(4)]
    live: list[tuple[Trader, str]] = []
    fills = 0
    for step in range(160):
        now = int(clock.now)
        roll = rng.random()
        trader = rng.choice(traders)
        if roll < 0.15 and live:
            owner, order_id = live.pop(rng.randrange(len(live)))
            try:
                service.cancel(_cancel(owner, order_id, now))
            except Exception as exc:  # already filled or expired: a 409 in the API
                assert type(exc).__name__ in {"OrderStateError"}
            continue
        if roll < 0.2:
            clock.advance(rng.randint(1, 30))
            service.expire_orders()
            continue
        fields: dict[str, Any] = {
            "device_class": rng.choice(["tpu-v5e", "cpu"]),
            "price": rng.randint(90, 110),
            "quantity": rng.randint(1, 20),
            "slo_ms": rng.choice([50, 100, 250]),
            "memory": rng.choice([0, 1 << 30, 1 << 34]),
            "expiry": now + rng.randint(5, 400),
        }
        body = trader.bid(now, **fields) if step % 2 else trader.ask(now, **fields)
        [result] = service.place([OrderCreate.model_validate(body)])
        fills += len(result.fills)
        live.append((trader, result.order.order_id))
    return fills


def _cancel(owner: Trader, order_id: str, now: int, **overrides: Any):  # type: ignore[no-untyped-def]
    from market.models import CancelCreate

    return CancelCreate.model_validate(owner.cancel(order_id, now, **overrides))


def test_restart_when_reopened_then_books_and_sequences_are_identical(
    settings: Settings, clock: Clock
) -> None:
    first = MarketService(settings, clock=clock)
    fills = _random_session(first, clock, random.Random(7))
    assert fills > 10
    before = {name: first.engine_snapshot(name) for name in first.device_classes()}
    books = {name: first.book(name) for name in first.device_classes()}
    first.close()

    second = MarketService(settings, clock=clock)
    assert {name: second.engine_snapshot(name) for name in second.device_classes()} == before
    assert {name: second.book(name) for name in second.device_classes()} == books
    # It carries on where the first left off: the next fill id follows the stored ones.
    best_bid = second.book("tpu-v5e").best_bid
    if best_bid is not None:
        [result] = second.place(
            [
                OrderCreate.model_validate(
                    Trader().ask(
                        int(clock.now), price=best_bid, slo_ms=1, memory=1 << 40, quantity=1
                    )
                )
            ]
        )
        expected = before["tpu-v5e"]["next_fill_id"]
        assert [f.fill_id for f in result.fills] == [expected]
    second.close()


def test_place_when_commit_fails_then_nothing_accepted_and_engine_rebuilt(
    service: MarketService, monkeypatch: pytest.MonkeyPatch
) -> None:
    alice, bob = Trader(), Trader()
    service.place([OrderCreate.model_validate(bob.ask(START, price=100))])
    snapshot = service.engine_snapshot("tpu-v5e")

    def broken(**_: object) -> None:
        raise RuntimeError("disk full")

    monkeypatch.setattr(storage, "record_placement", broken)
    with pytest.raises(RuntimeError):
        service.place([OrderCreate.model_validate(alice.bid(START, price=100))])
    assert service.engine_snapshot("tpu-v5e") == snapshot
    monkeypatch.undo()
    [result] = service.place([OrderCreate.model_validate(alice.bid(START, price=100))])
    assert len(result.fills) == 1


def test_accepted_order_survives_a_new_process_view(settings: Settings, clock: Clock) -> None:
    first = MarketService(settings, clock=clock)
    [result] = first.place([OrderCreate.model_validate(Trader().bid(START))])
    # No close(): a second service (another process after a crash) sees the committed order.
    second = MarketService(settings, clock=clock)
    assert second.order(result.order.order_id).state == "open"
    assert second.book("tpu-v5e").bids[0].quantity == 10
    first.close()
    second.close()


def test_nonce_when_used_by_an_order_or_a_cancel_then_neither_may_reuse_it_after_restart(
    settings: Settings, clock: Clock
) -> None:
    from market.errors import ReplayError

    alice = Trader()
    first = MarketService(settings, clock=clock)
    [placed] = first.place([OrderCreate.model_validate(alice.bid(START, nonce=5))])
    first.cancel(_cancel(alice, placed.order.order_id, START, nonce=6))
    first.close()

    second = MarketService(settings, clock=clock)
    [other] = second.place([OrderCreate.model_validate(alice.bid(START, nonce=7))])
    for nonce in (5, 6):  # an order's nonce, a cancel's nonce
        with pytest.raises(ReplayError):
            second.place([OrderCreate.model_validate(alice.bid(START, nonce=nonce, price=99))])
        with pytest.raises(ReplayError):
            second.cancel(_cancel(alice, other.order.order_id, START, nonce=nonce))
    assert second.order(other.order.order_id).state == "open"
    second.close()


def test_orders_past_their_expiry_are_forgotten_by_the_books_but_kept_in_storage(
    settings: Settings, clock: Clock
) -> None:
    from market.errors import OrderStateError

    alice, bob = Trader(), Trader()
    first = MarketService(settings, clock=clock)

    def place(body: dict[str, Any]) -> str:
        [result] = first.place([OrderCreate.model_validate(body)])
        return result.order.order_id

    resting = place(alice.ask(START, price=120, expiry=START + 10))
    maker = place(alice.ask(START, price=100, quantity=5, expiry=START + 10))
    taker = place(bob.bid(START, price=100, quantity=5, expiry=START + 10))
    lasting = place(bob.bid(START, price=90, expiry=START + 1_000))
    clock.advance(20)
    assert first.expire_orders() == 1  # the resting ask; the filled pair just goes
    snapshot = first.engine_snapshot("tpu-v5e")
    assert [o["order_id"] for o in snapshot["orders"]] == [lasting]
    assert snapshot["next_seq"] == 5
    assert first.books.get("tpu-v5e").quote_hashes == {}  # the asks' hashes went with them
    states = {i: first.order(i).state for i in (resting, maker, taker, lasting)}
    assert states == {resting: "expired", maker: "filled", taker: "filled", lasting: "open"}
    with pytest.raises(OrderStateError, match="expired to cancelled"):
        first.cancel(_cancel(alice, resting, int(clock.now)))
    first.close()

    # A restart reads what the books remember, and carries on the sequence numbers.
    second = MarketService(settings, clock=clock)
    assert second.engine_snapshot("tpu-v5e") == snapshot
    with pytest.raises(OrderStateError, match="filled to cancelled"):
        second.cancel(_cancel(bob, taker, int(clock.now)))
    now = int(clock.now)
    [fresh] = second.place([OrderCreate.model_validate(alice.ask(now, price=90, quantity=1))])
    assert fresh.order.seq == 5 and [f.bid_id for f in fresh.fills] == [lasting]
    second.close()


def test_quote_lookups_when_deals_are_matched_then_the_partial_index_serves_them(
    settings: Settings, clock: Clock
) -> None:
    """The matcher writes deals without a quote; the quote-hash index holds attached quotes only
    (migration 0005), and both lookups by quote hash are the queries it can serve."""
    from sqlalchemy import event, inspect
    from sqlmodel import Session

    from market import chain_index

    service = MarketService(settings, clock=clock)
    try:
        fills = _random_session(service, clock, random.Random(3))
        assert fills > 0
        with service.db.connect() as connection:
            attached = connection.exec_driver_sql(
                "SELECT COUNT(*) FROM deals WHERE quote_json IS NOT NULL"
            ).scalar()
        assert attached == 0  # what matching wrote: no deal enters the partial index
        [index] = [i for i in inspect(service.db).get_indexes("deals") if "quote_hash" in i["name"]]
        where = {
            k: str(v).strip("()")
            for k, v in index["dialect_options"].items()
            if k.endswith("_where")
        }
        assert list(where.values()) == ["quote_json IS NOT NULL"], index
        if service.db.dialect.name != "sqlite":
            return  # the planner's choice on a handful of rows is SQLite's to show
        seen: list[tuple[str, Any]] = []

        def remember(_conn: Any, _cursor: Any, statement: str, params: Any, *_: Any) -> None:
            if "quote_hash" in statement:
                seen.append((statement, params))

        event.listen(service.db, "before_cursor_execute", remember)
        try:
            with Session(service.db) as session:
                storage.quote_attached_elsewhere(session=session, quote_hash="0x01", deal_id="a")
                chain_index.link_chain_deal(
                    session=session, quote_hash="0x01", client="0x" + "00" * 20, chain_deal_id=1
                )
        finally:
            event.remove(service.db, "before_cursor_execute", remember)
        assert len(seen) == 2
        with service.db.connect() as connection:
            for statement, params in seen:
                plan = connection.exec_driver_sql(f"EXPLAIN QUERY PLAN {statement}", params)
                assert "USING INDEX ix_deals_quote_hash" in " ".join(str(r[-1]) for r in plan)
    finally:
        service.close()
