"""The single writer: requests that queue up together commit together, and fail alone."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import Future

import pytest
from sqlalchemy import create_engine, text

from market import storage
from market import writer as writer_module
from market.engine import MatchingEngine
from market.errors import DuplicateOrderError, OrderStateError, ReplayError
from market.models import CancelCreate, OrderCreate, PlaceResult
from market.placement import Placed
from market.service import MarketService
from market.settings import Settings
from tests.polling import hang_ceiling_s

from .conftest import START, Clock
from .signing import Trader


def _in_thread(call: Callable[[], list[PlaceResult]]) -> Future[list[PlaceResult]]:
    future: Future[list[PlaceResult]] = Future()

    def run() -> None:
        try:
            future.set_result(call())
        except BaseException as exc:
            future.set_exception(exc)

    threading.Thread(target=run, daemon=True).start()
    return future


def _queued_together(
    service: MarketService, calls: list[Callable[[], list[PlaceResult]]]
) -> list[Future[list[PlaceResult]]]:
    """Hold the writer in a call, queue `calls` behind it in this order, then let it go: the
    writer takes them as one group."""
    started, gate = threading.Event(), threading.Event()

    def hold() -> None:
        started.set()
        gate.wait(10)

    threading.Thread(target=service.writer.call, args=(hold,), daemon=True).start()
    assert started.wait(10)
    futures = []
    deadline = time.monotonic() + hang_ceiling_s(10)  # hang protection only
    for queued, call in enumerate(calls, start=1):
        futures.append(_in_thread(call))
        while service.writer.pending() < queued:  # each request queues before the next
            assert time.monotonic() < deadline, "a request never reached the writer"
    gate.set()
    return futures


def _place(service: MarketService, *bodies: dict[str, object]) -> Callable[[], list[PlaceResult]]:
    return lambda: service.place([OrderCreate.model_validate(b) for b in bodies])


def test_group_when_one_request_replays_a_nonce_then_only_it_fails(
    service: MarketService,
) -> None:
    alice, bob, carol = Trader(), Trader(), Trader()
    first, second, replay = (
        _place(service, bob.ask(START, price=100)),
        _place(service, alice.bid(START, price=100, nonce=5)),
        _place(service, alice.bid(START, price=101, nonce=5)),
    )
    later = _place(service, carol.bid(START, price=99))
    futures = _queued_together(service, [first, second, replay, later])
    assert futures[0].result(10)[0].order.state == "open"
    [matched] = futures[1].result(10)
    assert [f.price for f in matched.fills] == [100]
    with pytest.raises(ReplayError, match="nonce 5"):
        futures[2].result(10)
    assert futures[3].result(10)[0].order.state == "open"
    assert service.order(matched.order.order_id).state == "filled"
    assert [r.order.state for r in futures[3].result()] == ["open"]


def test_group_when_same_order_twice_then_second_is_duplicate(service: MarketService) -> None:
    body = Trader().bid(START)
    ask = Trader().ask(START, price=1_000)
    futures = _queued_together(
        service, [_place(service, ask), _place(service, body), _place(service, body)]
    )
    assert futures[1].result(10)[0].order.state == "open"
    with pytest.raises(DuplicateOrderError):
        futures[2].result(10)


def test_group_when_commit_fails_then_every_request_fails_and_books_rebuilt(
    service: MarketService, monkeypatch: pytest.MonkeyPatch
) -> None:
    alice, bob = Trader(), Trader()
    service.place([OrderCreate.model_validate(bob.ask(START, price=100, quantity=20))])
    snapshot = service.engine_snapshot("tpu-v5e")
    calls = [_place(service, alice.bid(START, price=100, quantity=1)) for _ in range(3)]

    def broken(**_: object) -> None:
        raise RuntimeError("disk full")

    monkeypatch.setattr(storage, "record_placement", broken)
    futures = _queued_together(service, calls)
    for future in futures:
        with pytest.raises(RuntimeError, match="disk full"):
            future.result(10)
    assert service.engine_snapshot("tpu-v5e") == snapshot
    assert service.orders(owner=alice.address, device_class=None, live_only=False, limit=9) == []


def test_nonce_when_its_order_expired_then_a_reuse_is_refused_from_sql(
    service: MarketService, clock: Clock
) -> None:
    alice, bob = Trader(), Trader()
    service.place([OrderCreate.model_validate(alice.bid(START, nonce=7, expiry=START + 60))])
    clock.advance(61)
    service.expire_orders()  # the order leaves memory; its row keeps the nonce
    assert len(service.books.get("tpu-v5e").engine) == 0
    now = service.now()
    reuse = alice.bid(now, price=101, nonce=7)
    fresh = bob.bid(now, price=99)
    futures = _queued_together(service, [_place(service, fresh), _place(service, reuse)])
    assert futures[0].result(10)[0].order.state == "open"  # its group-mate still commits
    with pytest.raises(ReplayError, match="nonce 7"):
        futures[1].result(10)
    assert service.writer.nonce_used(alice.address, 7)
    assert [
        o.nonce
        for o in service.orders(owner=alice.address, device_class=None, live_only=False, limit=9)
    ] == [7]


def test_memory_when_orders_fill_or_cancel_then_engine_holds_only_the_live_book(
    service: MarketService,
) -> None:
    alice, bob = Trader(), Trader()

    def engine() -> MatchingEngine:
        return service.books.get("tpu-v5e").engine

    ask = bob.ask(START, price=100, quantity=30, nonce=1)
    service.place([OrderCreate.model_validate(ask)])
    bids = [alice.bid(START, price=100, quantity=10, nonce=n) for n in (1, 2, 3)]
    results = service.place_batch([OrderCreate.model_validate(b) for b in bids])
    assert [r.state for r in results] == ["filled"] * 3
    assert len(engine()) == 0  # the ask and the three bids filled: nothing is remembered
    assert service.books.get("tpu-v5e").quote_hashes == {}
    resting = alice.bid(START, price=90, nonce=4)
    [placed] = service.place([OrderCreate.model_validate(resting)])
    assert len(engine()) == 1
    service.cancel(CancelCreate.model_validate(alice.cancel(placed.order.order_id, START, nonce=5)))
    assert len(engine()) == 0
    # Replay protection stays on disk: the same signed orders, their nonces and the cancel's.
    with pytest.raises(DuplicateOrderError):
        service.place([OrderCreate.model_validate(bids[0])])
    with pytest.raises(DuplicateOrderError):
        service.place([OrderCreate.model_validate(ask)])
    for nonce in (1, 4, 5):
        with pytest.raises(ReplayError, match=f"nonce {nonce}"):
            service.place([OrderCreate.model_validate(alice.bid(START, price=1, nonce=nonce))])
    cancel_again = alice.cancel(placed.order.order_id, START, nonce=6)
    with pytest.raises(OrderStateError):
        service.cancel(CancelCreate.model_validate(cancel_again))
    assert service.order(results[0].order_id).state == "filled"  # its row stays in SQL


def test_restart_when_history_is_dead_then_only_live_orders_are_loaded(
    service: MarketService, settings: Settings
) -> None:
    alice, bob = Trader(), Trader()
    for n in range(20):
        service.place([OrderCreate.model_validate(bob.ask(START, price=100, nonce=n))])
        service.place([OrderCreate.model_validate(alice.bid(START, price=100, nonce=n))])
    service.place([OrderCreate.model_validate(alice.bid(START, price=50, nonce=99))])
    live = service.engine_snapshot("tpu-v5e")
    assert len(live["orders"]) == 1
    service.close()
    again = MarketService(settings, clock=service.clock)
    try:
        assert again.engine_snapshot("tpu-v5e") == live
        with pytest.raises(ReplayError):
            again.place([OrderCreate.model_validate(alice.bid(START, price=1, nonce=3))])
    finally:
        again.close()


def _fill_seqs(service: MarketService) -> list[int]:
    with service.db.connect() as connection:
        return [seq for (seq,) in connection.exec_driver_sql("SELECT seq FROM fills ORDER BY seq")]


def test_fill_seq_when_a_group_with_fills_rolls_back_then_the_next_fill_follows_the_last_commit(
    service: MarketService, monkeypatch: pytest.MonkeyPatch
) -> None:
    alice, bob = Trader(), Trader()
    service.place([OrderCreate.model_validate(bob.ask(START, price=100, quantity=20))])
    service.place([OrderCreate.model_validate(alice.bid(START, price=100, quantity=1))])
    assert _fill_seqs(service) == [1]
    real = storage.record_placement

    def written_then_failed(**kwargs: object) -> int | None:
        real(**kwargs)  # type: ignore[arg-type]  # the fills are in the transaction...
        raise RuntimeError("commit lost")  # ...which rolls back

    monkeypatch.setattr(storage, "record_placement", written_then_failed)
    with pytest.raises(RuntimeError, match="commit lost"):
        _place(service, alice.bid(START, price=100, quantity=2))()
    monkeypatch.setattr(storage, "record_placement", real)
    [placed] = _place(service, alice.bid(START, price=100, quantity=3))()
    assert [f.quantity for f in placed.fills] == [3]
    service.place([OrderCreate.model_validate(alice.bid(START, price=100, quantity=4))])
    assert _fill_seqs(service) == [1, 2, 3]


def test_loop_requests_when_one_caller_stops_waiting_then_the_group_still_answers_the_others(
    service: MarketService,
) -> None:
    alice, bob = Trader(), Trader()
    now = service.now()
    checked = [
        service.verifier.order(OrderCreate.model_validate(body), now, float(now))
        for body in (bob.ask(START, price=100, quantity=3), alice.bid(START, price=100, quantity=1))
    ]
    started, gate = threading.Event(), threading.Event()

    def hold() -> None:
        started.set()
        gate.wait(10)

    async def run() -> list[Placed]:
        held = asyncio.get_running_loop().run_in_executor(None, service.writer.call, hold)
        assert started.wait(10)
        gone = service.writer.submit_async([checked[0]], now)
        kept = service.writer.submit_async([checked[1]], now)
        gone.cancel()  # its caller went away before the commit
        gate.set()
        await held
        return await asyncio.wait_for(kept, 10)

    [matched] = asyncio.run(run())
    assert [f.quantity for f in matched.fills] == [1]  # the ask was placed all the same
    assert service.order(checked[0].order.order_id).state == "partially_filled"


def test_writer_connection_when_the_database_dropped_it_while_idle_then_the_next_order_lands(
    backend: str | None, settings: Settings, clock: Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A PostgreSQL restart (or an idle timeout) ends the writer's kept connection: the next
    # group pings it first and reconnects, so no client's order fails for it.
    if backend is None:
        return  # SQLite: a file, no server to lose
    name = f"writer-{uuid.uuid4().hex[:12]}"
    settings = settings.model_copy(update={"database_url": f"{backend}&application_name={name}"})
    service = MarketService(settings, clock=clock)
    try:
        alice, bob = Trader(), Trader()
        service.place([OrderCreate.model_validate(bob.ask(START, price=100, quantity=5))])
        engine = create_engine(backend)
        with engine.connect() as other:
            ended = other.execute(
                text(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                    "WHERE application_name = :name"
                ),
                {"name": name},
            ).all()
        engine.dispose()
        assert ended and all(ok for (ok,) in ended)
        monkeypatch.setattr(writer_module, "IDLE_PING_S", 0.0)
        [placed] = service.place(
            [OrderCreate.model_validate(alice.bid(START, price=100, quantity=2))]
        )
        assert [f.quantity for f in placed.fills] == [2]
        assert _fill_seqs(service) == [1]
    finally:
        service.close()
