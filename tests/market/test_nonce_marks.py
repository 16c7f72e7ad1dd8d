"""Nonce marks: the writer skips the stored-pair lookup for nonces above what a signer stored,
and still refuses every used (signer, nonce) pair, whatever order the nonces come in.

The property (who must never lose what): a signer's signed order or cancel is stored at most
once per nonce, so nobody who saw a signature (in a request, a log, a past batch) can make the
market act on its nonce again; and a signer's own fresh nonce is never refused, whether it lies
above, below or between the nonces it used. The adversary replays used nonces with new terms,
reuses a cancel's nonce for an order, counts nonces down, and the market restarts (marks lost)
and forgets signers (marks evicted) between its moves.
"""

from __future__ import annotations

import itertools
import os
import shutil
import signal
import sqlite3
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import httpx
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from market import nonces, writer
from market.errors import DuplicateOrderError, ReplayError
from market.models import CancelCreate, OrderCreate
from market.service import MarketService
from market.settings import Settings
from tests.polling import hang_ceiling_s

from .conftest import START, Clock
from .server import market_process
from .signing import CHAIN_ID, ESCROW, Trader

SIGNERS = 3
PRICE = 1  # bids only, never filled: every placed order stays live and can be cancelled


class Lookups:
    """Counts the pairs the writer looks up in SQL (`market.writer.stored_pairs`)."""

    def __init__(self) -> None:
        self.pairs = 0
        self._real = writer.stored_pairs

    def __call__(
        self, connection: object, pairs: Sequence[tuple[str, int]]
    ) -> dict[tuple[str, int], str | None]:
        self.pairs += len(pairs)
        return self._real(connection, pairs)  # type: ignore[arg-type]


@pytest.fixture
def lookups(monkeypatch: pytest.MonkeyPatch) -> Lookups:
    counter = Lookups()
    monkeypatch.setattr(writer, "stored_pairs", counter)
    return counter


def _bid(trader: Trader, nonce: int, price: int = PRICE) -> OrderCreate:
    return OrderCreate.model_validate(trader.bid(START, price=price, nonce=nonce))


def test_counting_up_needs_no_lookup_and_a_replay_below_the_mark_is_looked_up_and_refused(
    service: MarketService, lookups: Lookups
) -> None:
    alice = Trader()
    service.place([_bid(alice, 5)])
    first = lookups.pairs  # alice's mark was read from SQL: none stored, so no pair looked up
    for nonce in (6, 7, 100):
        service.place([_bid(alice, nonce)])
    assert lookups.pairs == first == 0
    with pytest.raises(ReplayError, match="nonce 7"):
        service.place([_bid(alice, 7, price=2)])  # new terms, a used nonce: looked up, refused
    assert lookups.pairs == 1
    service.place([_bid(alice, 8)])  # below the mark, unused: looked up, placed
    assert lookups.pairs == 2


def test_cancel_nonce_raises_the_mark_so_an_order_cannot_reuse_it(
    service: MarketService, lookups: Lookups
) -> None:
    alice = Trader()
    [placed] = service.place([_bid(alice, 1)])
    cancel = alice.cancel(placed.order.order_id, START, nonce=50)
    service.cancel(CancelCreate.model_validate(cancel))
    with pytest.raises(ReplayError, match="nonce 50"):
        service.place([_bid(alice, 50)])  # the cancel's nonce, in another table: refused
    assert lookups.pairs == 1


def test_marks_off_when_other_processes_may_write_the_database(
    settings: Settings, clock: Clock, lookups: Lookups
) -> None:
    svc = MarketService(settings, clock=clock)
    try:
        shared = writer.Writer(
            books=svc.books, db=svc.db, on_commit=lambda _: None, sole_writer=False
        )
        alice = Trader()
        shared.place(svc.verifier.orders([_bid(alice, 3)], START, float(START)), START)
        shared.close()
        assert lookups.pairs == 1  # no marks: every pair is looked up
    finally:
        svc.close()


class NonceAdversary(RuleBasedStateMachine):
    """Signers and an adversary place and cancel with nonces in any order while the market
    restarts and forgets signers' marks; a pair is accepted exactly when it was never used."""

    def __init__(self) -> None:
        super().__init__()
        self.dir = Path(tempfile.mkdtemp(prefix="nonce-marks-"))
        self.settings = Settings(
            data_dir=self.dir, chain_id=CHAIN_ID, escrow=ESCROW, run_jobs=False
        )
        self.clock = Clock()
        self.service = MarketService(self.settings, clock=self.clock)
        # Fixed keys: an example replays the same order ids (hypothesis needs the same steps).
        self.traders = [Trader(key=f"0x{i + 1:064x}") for i in range(SIGNERS)]
        self.used: set[tuple[str, int]] = set()  # pairs the market accepted
        self.live: dict[str, tuple[str, int]] = {}  # order id -> (signer, its nonce)
        self.bodies: list[OrderCreate] = []  # every accepted order, as sent
        self.terms = itertools.count(2)  # prices of replays: new terms, new order ids

    def teardown(self) -> None:
        self.service.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    def _nonce(self, signer: int, how: str, pick: int) -> int:
        address = self.traders[signer].address
        mine = sorted(n for owner, n in self.used if owner == address)
        if how == "up" or not mine:
            return (mine[-1] if mine else 0) + 1 + pick % 3
        if how == "used":
            return mine[pick % len(mine)]
        if how == "other":  # another signer's used nonce: free for this one
            others = sorted(n for owner, n in self.used if owner != address) or [7]
            return others[pick % len(others)]
        return pick % (mine[-1] + 1)  # "below": at or below the highest, used or not

    @rule(
        signers=st.lists(st.integers(0, SIGNERS - 1), min_size=1, max_size=3),
        how=st.sampled_from(["up", "below", "used", "other"]),
        pick=st.integers(0, 50),
    )
    def place(self, signers: list[int], how: str, pick: int) -> None:
        orders, pairs = [], []
        for i, signer in enumerate(signers):
            trader = self.traders[signer]
            nonce = self._nonce(signer, how, pick + i)
            pairs.append((trader.address, nonce))
            orders.append(_bid(trader, nonce, price=next(self.terms)))
        fresh = len(set(pairs)) == len(pairs) and not set(pairs) & self.used
        try:
            placed = self.service.place(orders)
        except ReplayError:
            assert not fresh, f"fresh pairs {pairs} refused"
            return
        assert fresh, f"used pairs {pairs} accepted"
        self.used |= set(pairs)
        self.bodies += orders
        for result, (owner, nonce) in zip(placed, pairs, strict=True):
            self.live[result.order.order_id] = (owner, nonce)

    @precondition(lambda self: self.live)
    @rule(
        pick=st.integers(0, 50),
        how=st.sampled_from(["up", "below", "used", "other"]),
    )
    def cancel(self, pick: int, how: str) -> None:
        order_id = sorted(self.live)[pick % len(self.live)]
        owner, _ = self.live[order_id]
        signer = next(i for i, t in enumerate(self.traders) if t.address == owner)
        nonce = self._nonce(signer, how, pick)
        body = self.traders[signer].cancel(order_id, START, nonce=nonce)
        fresh = (owner, nonce) not in self.used
        try:
            self.service.cancel(CancelCreate.model_validate(body))
        except ReplayError:
            assert not fresh, f"fresh cancel nonce {nonce} refused"
            return
        assert fresh, f"used nonce {nonce} accepted for a cancel"
        self.used.add((owner, nonce))
        del self.live[order_id]

    @precondition(lambda self: self.bodies)
    @rule(pick=st.integers(0, 50))
    def resend_a_placed_order(self, pick: int) -> None:
        body = self.bodies[pick % len(self.bodies)]
        with pytest.raises((DuplicateOrderError, ReplayError)):
            self.service.place([body])

    @rule()
    def restart(self) -> None:
        self.service.close()
        self.service = MarketService(self.settings, clock=self.clock)

    @invariant()
    def stored_pairs_are_the_accepted_ones(self) -> None:
        with self.service.db.connect() as connection:
            rows = connection.exec_driver_sql(
                "SELECT owner, nonce FROM orders UNION ALL SELECT owner, nonce FROM nonces"
            ).all()
        assert sorted((o, int(n)) for o, n in rows) == sorted(self.used)


def test_nonce_adversary_never_gets_a_used_pair_through(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(nonces, "MAX_MARKED_SIGNERS", 2)  # fewer than the signers: evictions
    machine = settings(
        max_examples=25,
        stateful_step_count=25,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow],
    )(NonceAdversary)
    machine.TestCase().runTest()


def test_market_killed_mid_stream_then_every_stored_nonce_is_refused_after_restart(
    tmp_path: Path,
) -> None:
    """kill -9 while a signer posts orders and cancels, and again right after a cancel that
    holds the signer's highest nonce: the restarted market has no marks and reads them from SQL,
    so every nonce a killed process stored (acknowledged, or caught by the kill after its
    commit) is refused, and a fresh one is placed."""
    data = tmp_path / "data"
    alice = Trader()
    acknowledged: list[int] = []  # nonces the first process answered 200 for
    in_flight: list[int] = []  # the nonce of the request the kill cut
    stop = threading.Event()
    with market_process(data) as (url, pid):

        def post() -> None:
            with httpx.Client(base_url=url, timeout=30) as http:
                last = None
                while not stop.is_set():
                    now = int(time.time())
                    if last is not None and len(acknowledged) % 5 == 4:
                        body, path = alice.cancel(last, now), "/v1/orders/cancel"
                    else:
                        body, path = alice.bid(now, price=PRICE), "/v1/orders"
                    try:
                        reply = http.post(path, json=body)
                    except httpx.TransportError:
                        in_flight.append(body["nonce"])
                        return
                    reply.raise_for_status()
                    acknowledged.append(body["nonce"])
                    if path == "/v1/orders":
                        last = reply.json()["order"]["order_id"]

        poster = threading.Thread(target=post, daemon=True)
        poster.start()
        deadline = time.monotonic() + hang_ceiling_s(60)  # hang protection only
        while len(acknowledged) < 40:
            assert poster.is_alive() and time.monotonic() < deadline, "the poster stalled"
            time.sleep(0.01)
        os.kill(pid, signal.SIGKILL)
        poster.join(hang_ceiling_s(30))
        stop.set()
    assert len(acknowledged) >= 40 and len(in_flight) == 1
    with market_process(data) as (url, pid), httpx.Client(base_url=url, timeout=30) as http:
        now = int(time.time())
        for nonce in acknowledged:  # each stored nonce, reused with new terms: refused
            reply = http.post("/v1/orders", json=alice.bid(now, price=PRICE + 1, nonce=nonce))
            assert reply.status_code == 409, (nonce, reply.text)
        [cut] = in_flight  # stored or not: refused exactly when it is stored
        with sqlite3.connect(data / "market.sqlite3") as db:
            stored = db.execute(
                "SELECT count(*) FROM (SELECT nonce FROM orders WHERE nonce = ? "
                "UNION ALL SELECT nonce FROM nonces WHERE nonce = ?)",
                (cut, cut),
            ).fetchone()[0]
        reply = http.post("/v1/orders", json=alice.bid(now, price=PRICE + 1, nonce=cut))
        assert reply.status_code == (409 if stored else 201), reply.text
        # Now a cancel holds the signer's highest nonce when the market is killed.
        fresh = max([*acknowledged, cut]) + 1
        reply = http.post("/v1/orders", json=alice.bid(now, price=PRICE + 1, nonce=fresh))
        assert reply.status_code == 201, reply.text
        cancel = alice.cancel(reply.json()["order"]["order_id"], now, nonce=fresh + 1)
        http.post("/v1/orders/cancel", json=cancel).raise_for_status()
        os.kill(pid, signal.SIGKILL)
    with market_process(data) as (url, _), httpx.Client(base_url=url, timeout=30) as http:
        now = int(time.time())
        reply = http.post("/v1/orders", json=alice.bid(now, price=PRICE, nonce=fresh + 1))
        assert reply.status_code == 409, reply.text  # the cancel's nonce, read back from SQL
        reply = http.post("/v1/orders", json=alice.bid(now, price=PRICE, nonce=fresh + 2))
        assert reply.status_code == 201, reply.text
