"""Matching one group of verified orders in the engines, and the rows that record it.

Pure of I/O: the writer (`market.writer`) calls `match_orders` under the books' locks and writes
the returned rows in one transaction.
"""

from __future__ import annotations

from typing import NamedTuple

from market.books import ClassBook
from market.engine import Fill as EngineFill
from market.engine.gate import Gate
from market.storage import order_row
from market.verify import CheckedOrder


class Placed(NamedTuple):
    """What placing one order did: its sequence number, state and remaining units right after
    its own matching, and its fills."""

    checked: CheckedOrder
    seq: int
    state: str
    remaining: int
    fills: list[EngineFill]


class Rows(NamedTuple):
    """The rows one group's placement writes, as plain tuples (see `market.storage`)."""

    orders: list[tuple[object, ...]]
    updates: list[tuple[str, str, int]]
    fills: list[tuple[object, ...]]
    deals: list[tuple[object, ...]]


def match_orders(
    group: list[tuple[list[CheckedOrder], int]], books: dict[str, ClassBook], gate: Gate | None
) -> tuple[list[list[Placed]], Rows]:
    """Place every request's orders (with its `now`) of `group` in their engines, in order and
    through `gate` if any (the caller holds the books' locks); return each request's results and
    the rows to write."""
    results: list[list[Placed]] = []
    fills_out: list[tuple[object, ...]] = []
    deal_rows: list[tuple[object, ...]] = []
    new: list[tuple[CheckedOrder, ClassBook]] = []
    makers: dict[str, ClassBook] = {}
    for orders, now in group:
        placed: list[Placed] = []
        for c in orders:
            order = c.order
            order_id = order.order_id
            book = books[order.device_class]
            engine = book.engine
            fills = engine.place(order, now=now, gate=gate)
            if c.quote_hash:
                book.quote_hashes[order_id] = c.quote_hash
            record = engine.record(order_id)
            placed.append(Placed(c, record.seq, record.state.value, record.remaining, fills))
            new.append((c, book))
            for f in fills:
                fill_row, deal_row = fill_rows(f, book, c.created_at)
                fills_out.append(fill_row)
                deal_rows.append(deal_row)
                makers[f.maker_id] = book
        results.append(placed)
    order_rows: list[tuple[object, ...]] = []
    new_ids: set[str] = set()
    for c, book in new:  # the rows hold each order's state after the whole group
        o = c.order
        new_ids.add(o.order_id)
        record = book.engine.record(o.order_id)
        order_rows.append(
            order_row(
                o,
                c.nonce,
                record.seq,
                record.state.value,
                record.remaining,
                c.created_at,
                c.signature,
                c.quote_json,
                c.quote_signature,
                c.quote_hash,
            )
        )
    updates: list[tuple[str, str, int]] = []
    for maker_id, book in makers.items():
        if maker_id not in new_ids:
            record = book.engine.record(maker_id)
            updates.append((maker_id, record.state.value, record.remaining))
    return results, Rows(order_rows, updates, fills_out, deal_rows)


def fill_rows(
    f: EngineFill, book: ClassBook, created_at: float
) -> tuple[tuple[object, ...], tuple[object, ...]]:
    """Return the fills row and the deals row of one fill of `book`'s engine."""
    fill_id = f"{f.device_class}:{f.fill_id}"
    engine = book.engine
    fill = (
        fill_id,
        f.device_class,
        f.fill_id,
        f.bid_id,
        f.ask_id,
        f.price,
        f.quantity,
        f.aggressor.value,
        f.time,
    )
    deal = (
        fill_id,
        f.device_class,
        f.bid_id,
        f.ask_id,
        engine.record(f.bid_id).order.owner,
        engine.record(f.ask_id).order.owner,
        f.price,
        f.quantity,
        str(f.price * f.quantity),
        created_at,
        book.quote_hashes.get(f.ask_id, ""),
    )
    return fill, deal


def rematch_rows(fills: list[EngineFill], book: ClassBook, created_at: float) -> Rows:
    """Return the rows of fills made by matching `book`'s resting orders again
    (`MatchingEngine.rematch`): the fills, their deals, and both sides' progress."""
    fill_list: list[tuple[object, ...]] = []
    deals: list[tuple[object, ...]] = []
    touched: dict[str, None] = {}
    for f in fills:
        fill_row, deal_row = fill_rows(f, book, created_at)
        fill_list.append(fill_row)
        deals.append(deal_row)
        touched[f.bid_id] = touched[f.ask_id] = None
    engine = book.engine
    updates = [
        (order_id, record.state.value, record.remaining)
        for order_id, record in ((i, engine.record(i)) for i in touched)
    ]
    return Rows([], updates, fill_list, deals)
