"""The book is read from one committed version, even while orders pour in.

A real server process; posters send single orders of three SLOs and three memories
at overlapping prices (so most of them match) while readers read the book as the page does.
The engine never leaves a compatible pair crossed, so a book read from one version never shows
a compatible bid level at or above an ask level; a read whose bids and asks come from two
versions can (an ask that a later group filled shown beside the bid that took it, or the
reverse).
"""

from __future__ import annotations

import random
import threading
import time
from pathlib import Path
from typing import Any

import httpx

from .server import market_server
from .signing import Trader

POSTERS = 8
ORDERS_PER_POSTER = 150
MIN_READS = 60


def _compatible(bid: dict[str, Any], ask: dict[str, Any]) -> bool:
    return bool(
        bid["plan"] == ask["plan"]
        and ask["slo_ms"] <= bid["slo_ms"]
        and ask["memory"] >= bid["memory"]
    )


def _crossed(book: dict[str, Any]) -> list[tuple[int, int]]:
    """Return the (bid price, ask price) of every compatible pair of levels crossed or locked."""
    return [
        (b["price"], a["price"])
        for b in book["bids"]
        for a in book["asks"]
        if _compatible(b, a) and b["price"] >= a["price"]
    ]


def _orders(trader: Trader, rng: random.Random, now: int) -> list[dict[str, Any]]:
    orders = []
    for _ in range(ORDERS_PER_POSTER):
        terms: dict[str, Any] = {
            "slo_ms": rng.choice((50, 100, 250)),
            "memory": rng.choice((0, 16 << 30, 32 << 30)),
            "quantity": rng.randint(1, 5),
            "expiry": now + 3_600,
        }
        side = trader.bid if rng.random() < 0.5 else trader.ask
        orders.append(side(now, price=rng.randint(95, 105), **terms))
    return orders


def test_book_under_concurrent_posters_then_no_read_shows_a_compatible_pair_crossed(
    tmp_path: Path,
) -> None:
    rng = random.Random(26)
    now = int(time.time())
    signed = [_orders(Trader(), rng, now) for _ in range(POSTERS)]
    with market_server(
        tmp_path / "data", "--no-jobs", "--rate-per-address", "0", "--rate-per-ip", "0"
    ) as url:
        posting = threading.Event()
        posting.set()
        failures: list[str] = []
        crossed: list[list[tuple[int, int]]] = []
        reads = [0]

        def post(orders: list[dict[str, Any]]) -> None:
            with httpx.Client(base_url=url, timeout=60) as client:
                for body in orders:
                    response = client.post("/v1/orders", json=body)
                    if response.status_code != 201:
                        failures.append(response.text[:300])

        def read() -> None:
            with httpx.Client(base_url=url, timeout=60) as client:
                while posting.is_set() or reads[0] < MIN_READS:
                    book = client.get("/v1/book/tpu-v5e", params={"levels": 500}).json()
                    reads[0] += 1
                    pairs = _crossed(book)
                    if pairs:
                        crossed.append(pairs)

        posters = [threading.Thread(target=post, args=(o,)) for o in signed]
        readers = [threading.Thread(target=read) for _ in range(2)]
        for t in (*readers, *posters):
            t.start()
        for t in posters:
            t.join()
        posting.clear()
        for t in readers:
            t.join()
        fills = httpx.get(url + "/v1/fills", params={"limit": 500}).json()
    assert failures == []
    assert len(fills) > 100  # the load matched: there was something to read halfway
    assert reads[0] >= MIN_READS
    assert crossed == [], f"{len(crossed)} of {reads[0]} reads crossed, first: {crossed[0]}"
