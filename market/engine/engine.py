"""The matching engine: a continuous double auction per device class.

Pure: no I/O, no clock, no randomness. Time enters only through the `now` arguments, so a given
sequence of calls always yields the same fills and the same state.

Rules:
- price-time priority: better price first, then earlier sequence number;
- an ask and a bid trade only if `compatible(bid, ask)` (plan, SLO, memory) and they cross;
- the trade price is the resting order's limit price; partial fills leave the rest resting;
- an order is tradable while `now < expiry`. `place` skips resting orders whose expiry has
  passed without changing them; only `expire(now)` moves them to EXPIRED, so the caller (the
  storage layer's job) learns and records every state change it causes;
- the engine remembers an order while it is live, and a dead one (filled, cancelled) until
  the caller calls `release()` (once it has recorded the order's final state) or until its
  expiry: `expire(now)` forgets every order past its expiry, live or not. So a market that
  releases after each commit holds its live book, not its history; keeping replay protection
  for forgotten orders (their signed ids, their nonces) is the caller's part.

Because of the constraints the book may hold a bid priced at or above an ask when the two are
incompatible; the book is *crossed* only if a compatible live pair has `bid.price >= ask.price`,
which the engine never leaves behind without a gate. A gate (`market.engine.gate`) may hold a
compatible pair back (a silent provider, a bid its owner cannot pay for); `rematch` trades such
pairs once the gate lets them, oldest order first, as if it arrived then.
"""

from __future__ import annotations

from collections.abc import Mapping
from heapq import heappop, heappush

from market.engine.book import Book, PriceLevel
from market.engine.fills import Fill
from market.engine.gate import Gate
from market.engine.ladders import BookEntry
from market.engine.lifecycle import OrderState, check_transition
from market.engine.orders import Order, OrderRecord, Side
from market.engine.snapshot import (
    SNAPSHOT_VERSION,
    SnapshotData,
    get_int,
    record_from_data,
    record_to_data,
)
from market.errors import DuplicateOrderError, OrderExpiredError, SnapshotError, UnknownOrderError

_BID = Side.BID
_CANCELLED = OrderState.CANCELLED
_EXPIRED = OrderState.EXPIRED
_FILLED = OrderState.FILLED


class MatchingEngine:
    """Order books of every device class, with the records of every order placed.

    Not thread-safe: one writer drives an engine (the market runs one per device class or one
    behind a lock). Records of filled and cancelled orders are kept until `release()` or the
    order's expiry, so a reused order id is rejected as a duplicate while it is remembered; a
    released one must be refused by the caller (the market looks its nonce up in SQL). A
    snapshot holds what is remembered.
    """

    __slots__ = (
        "_books",
        "_books_by_class",
        "_dead",
        "_entries",
        "_expiry_buckets",
        "_expiry_heap",
        "_next_fill_id",
        "_next_seq",
    )

    def __init__(self) -> None:
        """Create an engine with empty books; sequence numbers and fill ids start at 1."""
        self._books: dict[tuple[str, str], Book] = {}
        self._books_by_class: dict[str, list[Book]] = {}
        self._entries: dict[str, BookEntry] = {}
        # Every remembered order by expiry, each bucket by id in sequence order, and a heap of
        # the expiries (a released bucket's may stay in it until due or a compaction): when a
        # bucket is due, its live orders expire and all of them are forgotten.
        self._expiry_buckets: dict[int, dict[str, BookEntry]] = {}
        self._expiry_heap: list[int] = []
        self._dead: dict[str, BookEntry] = {}  # filled or cancelled, not yet released
        self._next_seq = 1
        self._next_fill_id = 1

    # -- operations ---------------------------------------------------------------------------

    def place(self, order: Order, *, now: int, gate: Gate | None = None) -> list[Fill]:
        """Match `order` against the book of its device class and rest what is left.

        With a `gate`, only live providers' asks trade and a bid buys only what its owner can
        pay for (see `market.engine.gate`); what cannot trade rests.
        Return the fills in the order they happened (best resting order first). Raise
        `DuplicateOrderError` if the id was placed before and `OrderExpiredError` if
        `order.expiry <= now`.
        """
        order_id = order.order_id
        entries = self._entries
        if order_id in entries:
            raise DuplicateOrderError(order_id)
        if order.expiry <= now:
            raise OrderExpiredError(order_id, order.expiry, now)
        book = self._books.get((order.device_class, order.plan))
        if book is None:
            book = self._new_book(order.device_class, order.plan)
        seq = self._next_seq
        self._next_seq = seq + 1
        entry = BookEntry(order, seq, book)
        entries[order_id] = entry
        fill_id = self._next_fill_id
        if entry.is_bid:
            fills = book.place_bid(entry, now, fill_id, gate)
        else:
            fills = book.place_ask(entry, now, fill_id, gate)
        if fills:
            self._next_fill_id = fill_id + len(fills)
            self._note_dead(fills)
        expiry = order.expiry
        bucket = self._expiry_buckets.get(expiry)
        if bucket is None:
            self._expiry_buckets[expiry] = {order_id: entry}
            heappush(self._expiry_heap, expiry)
        else:
            bucket[order_id] = entry
        return fills

    def release(self) -> list[str]:
        """Forget the orders filled or cancelled since the last call; return their ids.

        Call once their final state is recorded elsewhere: `record` no longer knows them, and
        placing the same id again is no longer refused here.
        """
        dead = self._dead
        if not dead:
            return []
        self._dead = {}
        entries = self._entries
        buckets = self._expiry_buckets
        released: list[str] = []
        for order_id, entry in dead.items():
            del entries[order_id]
            released.append(order_id)
            bucket = buckets.get(entry.expiry)
            if bucket is not None:
                bucket.pop(order_id, None)
                if not bucket:
                    del buckets[entry.expiry]
        heap = self._expiry_heap
        if len(heap) > 2 * len(buckets) + 64:  # stale expiries of released buckets
            self._expiry_heap = sorted(buckets)
        return released

    def _note_dead(self, fills: list[Fill]) -> None:
        """List the orders `fills` left filled, for `release`."""
        entries = self._entries
        dead = self._dead
        for f in fills:
            for order_id in (f.bid_id, f.ask_id):
                entry = entries.get(order_id)
                if entry is not None and not entry.live and entry.state is _FILLED:
                    dead[order_id] = entry

    def rematch(self, now: int, gate: Gate | None = None) -> list[Fill]:
        """Match again the resting orders that cross the other side of their book, oldest
        first, through `gate`: orders a gate held back (a silent provider's ask, a bid its
        owner could not pay for) trade once it lets them, with no new order needed. Each
        trades as if it arrived at `now` (at the other order's price); what is left keeps its
        place in time priority. Without a gate the engine leaves nothing crossed, so this finds
        nothing. Return the fills in the order they happened."""
        fills: list[Fill] = []
        for book in self._books.values():
            for entry in book.crossing(now):
                if not entry.live:  # filled by an earlier one of this pass
                    continue
                fill_id = self._next_fill_id
                more = book.rematch(entry, now, fill_id, gate)
                if more:
                    self._next_fill_id = fill_id + len(more)
                    fills.extend(more)
        if fills:
            self._note_dead(fills)
        return fills

    def cancel(self, order_id: str) -> OrderRecord:
        """Withdraw a live order's unfilled units and return its final record.

        Raise `UnknownOrderError` for an unknown id and `OrderStateError` if the order is
        already filled, cancelled or expired.
        """
        entry = self._entries.get(order_id)
        if entry is None:
            raise UnknownOrderError(order_id)
        check_transition(order_id, entry.state, _CANCELLED)
        entry.book.remove(entry)
        entry.state = _CANCELLED
        self._dead[order_id] = entry
        return OrderRecord(entry.order, entry.seq, _CANCELLED, entry.remaining)

    def expire(self, now: int) -> list[OrderRecord]:
        """Expire every live order with `expiry <= now`; return them by (expiry, seq).

        Every order with `expiry <= now`, live or not, is then forgotten (see the class).
        """
        heap = self._expiry_heap
        buckets = self._expiry_buckets
        entries = self._entries
        dead = self._dead
        expired: list[OrderRecord] = []
        while heap and heap[0] <= now:
            for entry in buckets.pop(heappop(heap), {}).values():
                del entries[entry.order_id]
                if dead:
                    dead.pop(entry.order_id, None)
                if not entry.live:
                    continue
                check_transition(entry.order_id, entry.state, _EXPIRED)
                entry.book.remove(entry)
                entry.state = _EXPIRED
                expired.append(OrderRecord(entry.order, entry.seq, _EXPIRED, entry.remaining))
        return expired

    # -- queries ------------------------------------------------------------------------------

    def record(self, order_id: str) -> OrderRecord:
        """Return the record of an order; raise `UnknownOrderError` if it was never placed."""
        entry = self._entries.get(order_id)
        if entry is None:
            raise UnknownOrderError(order_id)
        return _record(entry)

    def __contains__(self, order_id: object) -> bool:
        """Return whether an order with this id is remembered (placed, expiry not yet past)."""
        return order_id in self._entries

    def __len__(self) -> int:
        """Return the number of orders remembered (live or not)."""
        return len(self._entries)

    def records(self) -> list[OrderRecord]:
        """Return the records of all remembered orders, in sequence order."""
        return [_record(e) for e in self._entries.values()]

    def open_orders(
        self, device_class: str, side: Side, plan: str | None = None
    ) -> list[OrderRecord]:
        """Return the live orders of one side of a book, in priority order (price, then seq)."""
        books = self._books_for(device_class, plan)
        entries = [entry for book in books for entry in book.live_entries(side)]
        if len(books) > 1:
            if side is _BID:
                entries.sort(key=lambda e: (-e.price, e.seq))
            else:
                entries.sort(key=lambda e: (e.price, e.seq))
        return [_record(e) for e in entries]

    def device_classes(self) -> list[str]:
        """Return the device classes that have a book, sorted."""
        return sorted(self._books_by_class)

    def plans(self, device_class: str) -> list[str]:
        """Return the plans that have a book in a device class, sorted."""
        return sorted(book.plan for book in self._books_by_class.get(device_class, ()))

    def depth(
        self,
        device_class: str,
        side: Side,
        levels: int | None = None,
        plan: str | None = None,
    ) -> list[PriceLevel]:
        """Return up to `levels` price levels of one side, best first, with live units.

        Levels sum over all plans unless `plan` names one.
        """
        books = self._books_for(device_class, plan)
        if len(books) == 1:
            return books[0].depth(side, levels)
        totals: dict[int, tuple[int, int]] = {}
        for book in books:
            for price, quantity, orders in book.depth(side):
                held_quantity, held_orders = totals.get(price, (0, 0))
                totals[price] = (held_quantity + quantity, held_orders + orders)
        prices = sorted(totals, reverse=side is _BID)[:levels]
        return [PriceLevel(p, *totals[p]) for p in prices]

    def best_bid(self, device_class: str, plan: str | None = None) -> int | None:
        """Return the highest live bid price of a device class (and plan, if given), or None."""
        prices = [b.best(Side.BID) for b in self._books_for(device_class, plan)]
        return max((p for p in prices if p is not None), default=None)

    def best_ask(self, device_class: str, plan: str | None = None) -> int | None:
        """Return the lowest live ask price of a device class (and plan, if given), or None."""
        prices = [b.best(Side.ASK) for b in self._books_for(device_class, plan)]
        return min((p for p in prices if p is not None), default=None)

    @property
    def next_seq(self) -> int:
        """Return the sequence number the next placed order will get."""
        return self._next_seq

    @property
    def next_fill_id(self) -> int:
        """Return the id the next fill will get."""
        return self._next_fill_id

    # -- persistence --------------------------------------------------------------------------

    def snapshot(self) -> SnapshotData:
        """Return the whole state as JSON-ready plain data (see `market.engine.snapshot`)."""
        return {
            "version": SNAPSHOT_VERSION,
            "next_seq": self._next_seq,
            "next_fill_id": self._next_fill_id,
            "orders": [record_to_data(_record(e)) for e in self._entries.values()],
        }

    @classmethod
    def restore(cls, data: Mapping[str, object]) -> MatchingEngine:
        """Rebuild an engine from `snapshot()` data; raise `SnapshotError` if it is not valid.

        The restored engine has the same state and yields the same fills for the same future
        calls as the engine that wrote the snapshot.
        """
        if not isinstance(data, Mapping):
            raise SnapshotError(f"a snapshot must be a mapping, got {type(data).__name__}")
        version = get_int(data, "version")
        if version != SNAPSHOT_VERSION:
            raise SnapshotError(f"unsupported snapshot version {version}")
        next_seq = get_int(data, "next_seq")
        next_fill_id = get_int(data, "next_fill_id")
        if next_seq < 1 or next_fill_id < 1:
            raise SnapshotError("next_seq and next_fill_id must be at least 1")
        raw_orders = data.get("orders")
        if not isinstance(raw_orders, list):
            raise SnapshotError("orders must be a list")
        records = sorted((record_from_data(r) for r in raw_orders), key=lambda r: r.seq)
        engine = cls()
        previous_seq = 0
        for rec in records:
            if rec.seq <= previous_seq or rec.seq >= next_seq:
                raise SnapshotError(f"order {rec.order_id!r}: sequence {rec.seq} out of order")
            previous_seq = rec.seq
            if rec.order_id in engine._entries:
                raise SnapshotError(f"order {rec.order_id!r} appears twice")
            book = engine._books.get((rec.order.device_class, rec.order.plan))
            if book is None:
                book = engine._new_book(rec.order.device_class, rec.order.plan)
            entry = BookEntry(rec.order, rec.seq, book)
            entry.remaining = rec.remaining
            entry.state = rec.state
            engine._entries[rec.order_id] = entry
            if rec.state.is_live:
                book.rest(entry)
            engine._expiry_buckets.setdefault(rec.order.expiry, {})[rec.order_id] = entry
        engine._expiry_heap = sorted(engine._expiry_buckets)
        engine._next_seq = next_seq
        engine._next_fill_id = next_fill_id
        return engine

    def _new_book(self, device_class: str, plan: str) -> Book:
        book = self._books[device_class, plan] = Book(device_class, plan)
        self._books_by_class.setdefault(device_class, []).append(book)
        return book

    def _books_for(self, device_class: str, plan: str | None) -> list[Book]:
        if plan is None:
            return self._books_by_class.get(device_class, [])
        book = self._books.get((device_class, plan))
        return [] if book is None else [book]


def _record(entry: BookEntry) -> OrderRecord:
    return OrderRecord(entry.order, entry.seq, entry.state, entry.remaining)
