"""Two market processes on one PostgreSQL database, each the single writer of its own device
classes (`--device-classes`, `market.partition`): real `market serve` processes, real
PostgreSQL, and for the funds check a real anvil with the escrow.

Properties: fills of both processes carry unique `seq` numbers in commit order (per class in
fill-id order, no gaps), no book is ever crossed, an order for the other process's class is
refused with a reason naming the classes served, a kill -9 of one process loses no order either
acknowledged, a second writer of a class is refused at start, a signer cannot commit more
than its escrow balance by spreading bids over the two processes, and when the process that
indexes the chain is killed the other indexes on.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import create_engine, text

from contracts.chain import Anvil
from market.database import database_url
from tests.polling import wait_until

from .chain import MIN_WINDOW, ChainWorld, deploy_world
from .server import market_process
from .signing import Trader

A, B = "tpu-part-a", "tpu-part-b"
POSTERS = 4  # per class
ORDERS = 40  # per poster
STAKE = 1_000_000


def _data(tmp_path: Path, name: str) -> Path:
    """A market's data dir (its log goes beside it)."""
    (tmp_path / name).mkdir(exist_ok=True)
    return tmp_path / name / "data"


def _moved(urls: dict[str, str], device_class: str, before: str) -> bool:
    """Return whether the process of `device_class` answers at another URL than `before`."""
    return urls[device_class] != before


def _rows(url: str, query: str) -> list[Any]:
    engine = create_engine(database_url(data_dir=Path("."), url=url))
    try:
        with engine.connect() as connection:
            return list(connection.execute(text(query)))
    finally:
        engine.dispose()


def _post(url: str, path: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(url + path, json=body, timeout=60)


def _order(trader: Trader, device_class: str, i: int) -> dict[str, Any]:
    """Alternating bids and asks around one price: many of them cross."""
    now = int(time.time())
    price = 100 + (i * 7) % 11
    if i % 2:
        return trader.ask(now, device_class=device_class, price=price, quantity=1 + i % 3)
    return trader.bid(now, device_class=device_class, price=price, quantity=1 + i % 4)


def test_two_processes_when_posters_hit_both_and_one_is_killed_then_fills_are_one_sequence(
    pg: str, tmp_path: Path
) -> None:
    urls: dict[str, str] = {}
    acked: list[str] = []
    refused: list[dict[str, Any]] = []
    errors: list[BaseException] = []
    lock = threading.Lock()
    progress = {A: 0, B: 0}

    def send(device_class: str, body: dict[str, Any]) -> tuple[httpx.Response, bool]:
        """Post to the process of `device_class`; after a kill, post the same body again once
        it is back; return the answer and whether it was sent again."""
        retried = False
        while True:
            url = urls[device_class]
            try:
                return _post(url, "/v1/orders", body), retried
            except httpx.TransportError:
                retried = True
                wait_until(partial(_moved, urls, device_class, url), 300, "the killed one back")

    def post(device_class: str, body: dict[str, Any]) -> httpx.Response:
        """Place an order: 201, or after a kill 409 if the killed process had committed it
        unanswered."""
        response, retried = send(device_class, body)
        if retried and response.status_code == 409:
            assert response.json()["error"] == "DuplicateOrderError", response.text
        else:
            assert response.status_code == 201, response.text
        return response

    def poster(device_class: str, wrong: str) -> None:
        trader = Trader()
        try:
            for i in range(ORDERS):
                response = post(device_class, _order(trader, device_class, i))
                with lock:
                    if response.status_code == 201:
                        acked.append(response.json()["order"]["order_id"])
                    progress[device_class] += 1
                if i % 10 == 0:  # the other process's class, sent here: refused, with reason
                    body = trader.bid(int(time.time()), device_class=wrong)
                    other, _ = send(device_class, body)
                    with lock:
                        refused.append({"status": other.status_code, **other.json()})
        except BaseException as exc:  # the test thread reports it
            errors.append(exc)

    flags = ("--database-url", pg, "--no-jobs")
    data_a, data_b = _data(tmp_path, "a"), _data(tmp_path, "b")
    with market_process(data_b, *flags, "--device-classes", B) as (url_b, _):
        urls[B] = url_b
        first = market_process(data_a, *flags, "--device-classes", A)
        urls[A], pid_a = first.__enter__()
        threads = [
            threading.Thread(target=poster, args=(name, other), daemon=True)
            for name, other in ((A, B), (B, A))
            for _ in range(POSTERS)
        ]
        for thread in threads:
            thread.start()
        closed = False
        try:
            wait_until(lambda: progress[A] >= POSTERS * ORDERS // 3, 300, "orders acked by A")
            os.kill(pid_a, signal.SIGKILL)  # mid-stream: what A acknowledged must survive
            first.__exit__(None, None, None)
            closed = True
            with market_process(data_a, *flags, "--device-classes", A) as (url_a, _):
                urls[A] = url_a
                for thread in threads:
                    thread.join(timeout=600)
                assert not any(t.is_alive() for t in threads)
                books = [
                    httpx.get(f"{url}/v1/book/{name}", timeout=30).json()
                    for url in (url_a, url_b)
                    for name in (A, B)
                ]
        finally:
            if not closed:
                first.__exit__(None, None, None)
    assert not errors, errors
    assert len(acked) >= 2 * POSTERS * ORDERS - POSTERS  # at most one unanswered per poster
    stored = {order_id for (order_id,) in _rows(pg, "SELECT order_id FROM orders")}
    assert set(acked) <= stored  # every acknowledged order of either process survived
    assert refused and all(r["status"] == 421 for r in refused)
    assert all(r["error"] == "WrongClassError" for r in refused)
    assert all("this one serves tpu-part-" in r["detail"] for r in refused)
    fills = _rows(pg, "SELECT device_class, fill_id, seq FROM fills ORDER BY seq")
    assert {row[0] for row in fills} == {A, B}  # both processes matched
    seqs = [row[2] for row in fills]
    assert seqs == list(range(1, len(fills) + 1))  # unique, in one sequence, no gap
    for name in (A, B):  # within a class, seq follows the class's fill order
        ids = [row[1] for row in fills if row[0] == name]
        assert ids == sorted(ids) and len(set(ids)) == len(ids)
    for name in (A, B):  # no crossed pair: every live bid below every live ask
        [(best_bid, best_ask)] = _rows(
            pg,
            "SELECT (SELECT MAX(price) FROM orders WHERE side = 'bid' AND device_class = "
            f"'{name}' AND state IN ('open', 'partially_filled')), (SELECT MIN(price) FROM "
            f"orders WHERE side = 'ask' AND device_class = '{name}' AND state IN "
            "('open', 'partially_filled'))",
        )
        assert best_bid is None or best_ask is None or best_bid < best_ask
    for book in books:  # either process serves both books
        if book["bids"] and book["asks"]:
            assert book["bids"][0]["price"] < book["asks"][0]["price"]


def test_second_writer_of_a_class_or_a_partition_on_sqlite_then_refused_at_start(
    pg: str, tmp_path: Path
) -> None:
    flags = ("--database-url", pg, "--no-jobs")
    with market_process(_data(tmp_path, "a"), *flags, "--device-classes", f"{A},{B}"):
        for extra in (("--device-classes", f"{B},x"), ()):
            with (
                pytest.raises(RuntimeError, match="another market process on this database"),
                market_process(_data(tmp_path, "b"), *flags, *extra),
            ):
                pass
    with (
        pytest.raises(RuntimeError, match="need PostgreSQL"),
        market_process(_data(tmp_path, "c"), "--device-classes", A),
    ):
        pass
    with (
        market_process(_data(tmp_path, "d")),  # SQLite: one process per database file
        pytest.raises(RuntimeError, match="another market process serves the SQLite"),
        market_process(_data(tmp_path, "d")),
    ):
        pass


# -- the funds check across processes ------------------------------------------------------------


@pytest.fixture(scope="module")
def world() -> Iterator[ChainWorld]:
    with Anvil.start(accounts=10) as anvil:
        yield deploy_world(anvil)


def _fresh(world: ChainWorld) -> Trader:
    key = "0x" + os.urandom(32).hex()
    world.fund(key)
    return world.trader(key)


def test_a_signer_when_it_spreads_bids_over_both_processes_then_never_above_its_balance(
    world: ChainWorld, pg: str, tmp_path: Path
) -> None:
    flags = ["--database-url", pg, "--rpc-url", world.anvil.url, "--escrow", world.escrow.address]
    flags += ["--chain-id", "31337"]
    with (
        market_process(_data(tmp_path, "a"), *flags, "--device-classes", A) as (url_a, _),
        market_process(_data(tmp_path, "b"), *flags, "--device-classes", B) as (url_b, _),
    ):
        beat = int(time.time())
        for url, name in ((url_a, A), (url_b, B)):  # a staked provider advertises each class
            provider = _fresh(world)
            world.escrow.stake(provider.key, 2 * STAKE)
            response = _post(
                url, "/v1/providers/heartbeat", provider.heartbeat(beat, device_class=name)
            )
            assert response.status_code == 200, response.text
        wrong = _post(
            url_a, "/v1/providers/heartbeat", provider.heartbeat(beat + 1, device_class=B)
        )
        assert wrong.status_code == 421 and A in wrong.json()["detail"]
        # One after the other: the second process sees the first's bid.
        client = _fresh(world)
        world.escrow.deposit(client.key, 10_000)
        now = int(time.time())
        placed = _post(
            url_a, "/v1/orders", client.bid(now, device_class=A, price=100, quantity=100)
        )
        assert placed.status_code == 201, placed.text
        refused = _post(url_b, "/v1/orders", client.bid(now, device_class=B, price=100, quantity=1))
        assert refused.status_code == 403, refused.text
        assert "on top of 10000 committed" in refused.json()["detail"]
        cancel = client.cancel(placed.json()["order"]["order_id"], now)
        assert _post(url_b, "/v1/orders/cancel", cancel).status_code == 421  # cancel it at A
        assert (
            _post(url_a, "/v1/orders/cancel", client.cancel(cancel["order_id"], now)).status_code
            == 200
        )
        again = _post(url_b, "/v1/orders", client.bid(now, device_class=B, price=100, quantity=100))
        assert again.status_code == 201, again.text
        # At the same instant, each client's whole balance twice: one of the two, never both.
        for _ in range(4):
            client = _fresh(world)
            world.escrow.deposit(client.key, 5_000)
            bodies = [
                (url, client.bid(now, device_class=name, price=50, quantity=100))
                for url, name in ((url_a, A), (url_b, B))
            ]
            assert sorted(_at_once(bodies)) == [201, 403]
        assert MIN_WINDOW  # the world's quotes need no ask here: bids rest unmatched


def _ask(provider: Trader, device_class: str, price: int, quantity: int) -> dict[str, Any]:
    now = int(time.time())
    quote = provider.quote(slo_ms=100, valid_until=now + 3_600, challenge_window=MIN_WINDOW)
    return provider.ask(now, price=price, quantity=quantity, quote=quote, device_class=device_class)


def test_deals_and_withdrawals_when_one_process_matched_them_then_the_other_counts_them(
    world: ChainWorld, pg: str, tmp_path: Path
) -> None:
    """A deal matched by one process counts against the signer's bids at the other; a bid
    resting at the process that does not index the chain never fills once its funds are
    withdrawn (its match gate reads the balance at the new block)."""
    flags = ["--database-url", pg, "--rpc-url", world.anvil.url, "--escrow", world.escrow.address]
    flags += ["--chain-id", "31337"]
    with (  # A starts first: it indexes the chain; B does not
        market_process(_data(tmp_path, "a"), *flags, "--device-classes", A) as (url_a, _),
        market_process(_data(tmp_path, "b"), *flags, "--device-classes", B) as (url_b, _),
    ):
        sellers = {}
        for url, name in ((url_a, A), (url_b, B)):
            sellers[name] = provider = _fresh(world)
            world.escrow.stake(provider.key, 2 * STAKE)
            beat = provider.heartbeat(int(time.time()), device_class=name)
            assert _post(url, "/v1/providers/heartbeat", beat).status_code == 200
        client = _fresh(world)
        world.escrow.deposit(client.key, 10_000)
        assert _post(url_a, "/v1/orders", _ask(sellers[A], A, 100, 60)).status_code == 201
        now = int(time.time())
        placed = _post(url_a, "/v1/orders", client.bid(now, device_class=A, price=100, quantity=60))
        assert placed.status_code == 201 and placed.json()["fills"], placed.text  # a deal: 6,000
        refused = _post(
            url_b, "/v1/orders", client.bid(now, device_class=B, price=100, quantity=41)
        )
        assert refused.status_code == 403 and "on top of 6000 committed" in refused.text
        resting = _post(
            url_b, "/v1/orders", client.bid(now, device_class=B, price=100, quantity=40)
        )
        assert resting.status_code == 201, resting.text
        world.escrow.withdraw(client.key, 10_000)  # the deal is not open: the balance is free
        answer = _post(url_b, "/v1/orders", _ask(sellers[B], B, 100, 40))
        assert answer.status_code == 201 and answer.json()["fills"] == [], answer.text
        order = httpx.get(f"{url_b}/v1/orders/{resting.json()['order']['order_id']}").json()
        assert order["state"] == "open" and order["remaining"] == 40


def _at_once(posts: list[tuple[str, dict[str, Any]]]) -> list[int]:
    """Post each (url, order) from its own thread, released together; return the statuses."""
    statuses: list[int] = []
    start = threading.Barrier(len(posts))

    def send(url: str, body: dict[str, Any]) -> None:
        start.wait()
        statuses.append(_post(url, "/v1/orders", body).status_code)

    threads = [threading.Thread(target=send, args=pair) for pair in posts]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    return statuses


def _indexed_block(url: str) -> int:
    """The block a market process has indexed up to (its metrics), -1 before any."""
    for line in httpx.get(url + "/metrics", timeout=60).text.splitlines():
        if line.startswith("market_indexed_block "):
            return int(float(line.split()[1]))
    return -1


def test_the_indexing_process_killed_then_the_other_takes_the_lock_and_indexes_on(
    world: ChainWorld, pg: str, tmp_path: Path
) -> None:
    """The indexer lock goes with the indexing process's connection: kill -9 it, and the
    other process indexes the chain from where the index stood (`market.follower`)."""
    flags = ["--database-url", pg, "--rpc-url", world.anvil.url, "--escrow", world.escrow.address]
    flags += ["--chain-id", "31337"]
    first = market_process(_data(tmp_path, "a"), *flags, "--device-classes", A)
    url_a, pid_a = first.__enter__()  # A starts first: it takes the indexer lock
    killed = False
    try:
        with market_process(_data(tmp_path, "b"), *flags, "--device-classes", B) as (url_b, _):
            client = _fresh(world)
            world.escrow.deposit(client.key, 1_000)
            head = world.head()
            wait_until(lambda: _indexed_block(url_a) >= head, 300, "A indexing")
            assert _indexed_block(url_b) < head  # B follows A's index; it indexes nothing
            os.kill(pid_a, signal.SIGKILL)
            first.__exit__(None, None, None)
            killed = True
            world.escrow.deposit(client.key, 2_000)
            head = world.head()
            wait_until(lambda: _indexed_block(url_b) >= head, 300, "B indexing after A's kill")
    finally:
        if not killed:
            first.__exit__(None, None, None)
