"""The parts of a book (`market.engine.book`): entries, levels, ladders, sides and walks.

Internal to the engine. A side keeps one `Ladder` per terms (SLO and memory) of its resting
orders, each a dict from price to `Level` (a FIFO queue of entries in time priority) and the
sorted list of its prices; and `Total`s, its live units and orders per price over all terms. A
`Walk` is a taker's place in one ladder of the other side while it matches.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections import deque
from typing import TYPE_CHECKING

from market.engine.gate import Gate
from market.engine.lifecycle import OrderState
from market.engine.orders import Order, Side

if TYPE_CHECKING:
    from market.engine.book import Book

_BID = Side.BID
_OPEN = OrderState.OPEN
_FILLED = OrderState.FILLED

# Rebuild a queue without its dead entries once they outnumber the live ones by this much.
COMPACT_SLACK = 32


class BookEntry:
    """Mutable engine state of one order; `live` is True while it rests and can trade.

    Holds copies of the order fields the matching loops read (price, SLO, memory, id, side), so
    the hot paths never reach through to the `Order`; `ladder` is the one it rests in.
    """

    __slots__ = (
        "book",
        "expiry",
        "is_bid",
        "ladder",
        "live",
        "memory",
        "order",
        "order_id",
        "owner",
        "price",
        "remaining",
        "seq",
        "slo_ms",
        "state",
    )

    def __init__(self, order: Order, seq: int, book: Book) -> None:
        """Wrap a newly placed `order` of `book` with its sequence number; it starts OPEN."""
        self.order = order
        self.seq = seq
        self.book = book
        self.order_id = order.order_id
        self.owner = order.owner
        self.is_bid = order.side is _BID
        self.price = order.price
        self.slo_ms = order.slo_ms
        self.memory = order.memory
        self.expiry = order.expiry
        self.remaining = order.quantity
        self.state = _OPEN
        self.live = False
        self.ladder: Ladder | None = None


class Level:
    """A price's queue of entries (one terms) and its live units and orders."""

    __slots__ = ("count", "quantity", "queue")

    def __init__(self) -> None:
        self.queue: deque[BookEntry] = deque()
        self.quantity = 0
        self.count = 0


_NO_LEVEL = Level()


class Total:
    """Live units and orders at one price of one side, over all terms."""

    __slots__ = ("count", "quantity")

    def __init__(self) -> None:
        self.quantity = 0
        self.count = 0


class Ladder:
    """The resting orders of one side with one terms: levels by price, prices ascending."""

    __slots__ = ("levels", "memory", "prices", "slo_ms")

    def __init__(self, slo_ms: int, memory: int) -> None:
        self.slo_ms = slo_ms
        self.memory = memory
        self.levels: dict[int, Level] = {}
        self.prices: list[int] = []


class BookSide:
    """One side of a book: a ladder per terms; live units and orders per price over all terms."""

    __slots__ = ("ladders", "prices", "totals")

    def __init__(self) -> None:
        self.ladders: dict[tuple[int, int], Ladder] = {}
        self.totals: dict[int, Total] = {}
        self.prices: list[int] = []

    def add(self, entry: BookEntry) -> None:
        """Append live `entry` to the back of its level in the ladder of its terms."""
        key = (entry.slo_ms, entry.memory)
        ladder = self.ladders.get(key)
        if ladder is None:
            ladder = self.ladders[key] = Ladder(entry.slo_ms, entry.memory)
        entry.ladder = ladder
        price = entry.price
        level = ladder.levels.get(price)
        if level is None:
            level = ladder.levels[price] = Level()
            insort(ladder.prices, price)
        level.queue.append(entry)
        level.quantity += entry.remaining
        level.count += 1
        total = self.totals.get(price)
        if total is None:
            total = self.totals[price] = Total()
            insort(self.prices, price)
        total.quantity += entry.remaining
        total.count += 1
        entry.live = True

    def count_out(self, price: int, units: int) -> None:
        """Take one order of `units` live units out of the totals at `price`."""
        total = self.totals[price]
        total.quantity -= units
        total.count -= 1
        if total.count == 0:
            del self.totals[price]
            del self.prices[bisect_left(self.prices, price)]

    def drop_level(self, ladder: Ladder, index: int) -> None:
        """Delete the empty level at `ladder.prices[index]`, and the ladder if it empties."""
        del ladder.levels[ladder.prices[index]]
        del ladder.prices[index]
        if not ladder.prices:
            self.forget(ladder)

    def forget(self, ladder: Ladder) -> None:
        """Delete empty `ladder` (a ladder with live orders is never forgotten)."""
        key = (ladder.slo_ms, ladder.memory)
        if self.ladders.get(key) is ladder:
            del self.ladders[key]


class Walk:
    """A taker's place in one ladder of the other side: the price at index `i` and queue
    position `j`; `entry` the next order there it may trade with, in `level` at `price`."""

    __slots__ = ("entry", "i", "j", "ladder", "level", "price")

    def __init__(self, ladder: Ladder, i: int, entry: BookEntry) -> None:
        """Start at index `i` of `ladder`; `entry` stands in until `next_ask`/`next_bid`."""
        self.ladder = ladder
        self.i = i
        self.j = 0
        self.entry = entry
        self.level = _NO_LEVEL
        self.price = 0


def next_ask(side: BookSide, walk: Walk, now: int, limit: int, gate: Gate | None) -> bool:
    """Move `walk` (ascending) to the next live, unexpired ask at most `limit` whose provider the
    gate lets trade; drop the levels it leaves empty. Return False when there is none."""
    ladder = walk.ladder
    prices = ladder.prices
    i = walk.i
    j = walk.j
    while i < len(prices):
        price = prices[i]
        if price > limit:
            break
        level = ladder.levels[price]
        j = _first_in_level(level, j, now, gate)
        if j >= 0:
            walk.i, walk.j, walk.entry, walk.level, walk.price = i, j, level.queue[j], level, price
            return True
        if not _leave_level(ladder, i, level):
            i += 1
        j = 0
    if not prices:
        side.forget(ladder)
    return False


def next_bid(side: BookSide, walk: Walk, now: int, limit: int) -> bool:
    """Move `walk` (descending) to the next live, unexpired bid at least `limit`; drop the
    levels it leaves empty. Return False when there is none."""
    ladder = walk.ladder
    prices = ladder.prices
    i = walk.i
    j = walk.j
    while i >= 0:
        price = prices[i]
        if price < limit:
            break
        level = ladder.levels[price]
        j = _first_in_level(level, j, now, None)
        if j >= 0:
            walk.i, walk.j, walk.entry, walk.level, walk.price = i, j, level.queue[j], level, price
            return True
        _leave_level(ladder, i, level)
        i -= 1
        j = 0
    if not prices:
        side.forget(ladder)
    return False


def _first_in_level(level: Level, j: int, now: int, gate: Gate | None) -> int:
    """Return the queue position, from `j` on, of the first live and unexpired entry (whose
    provider `gate` lets trade, with a gate), dropping dead entries at the head; -1 if none."""
    queue = level.queue
    n = len(queue)
    while j < n:
        entry = queue[j]
        if not entry.live:
            if j == 0:
                queue.popleft()
                n -= 1
            else:
                j += 1
            continue
        if entry.expiry <= now or (gate is not None and not gate.ask_live(entry.owner)):
            j += 1
            continue
        return j
    return -1


def _leave_level(ladder: Ladder, i: int, level: Level) -> bool:
    """A walk leaves `level`, at `ladder.prices[i]`: delete it if it holds no live order (and
    return True), or compact its queue if dead entries outnumber the live ones by far."""
    if level.count == 0:
        del ladder.levels[ladder.prices[i]]
        del ladder.prices[i]
        return True
    if len(level.queue) > 2 * level.count + COMPACT_SLACK:
        level.queue = deque([e for e in level.queue if e.live])
    return False


def first_walk(walks: list[Walk], highest: bool) -> Walk:
    """Return the walk whose order comes first: the lowest price (the highest with `highest`:
    bids), then the earliest."""
    best = walks[0]
    for walk in walks:
        if walk.price == best.price:
            if walk.entry.seq < best.entry.seq:
                best = walk
        elif (walk.price > best.price) == highest:
            best = walk
    return best


def take_filled(side: BookSide, walk: Walk, entry: BookEntry) -> None:
    """Mark `entry`, the walk's current order, FILLED and step the walk past it."""
    entry.remaining = 0
    entry.state = _FILLED  # OPEN | PARTIALLY_FILLED -> FILLED
    entry.live = False
    walk.level.count -= 1
    side.count_out(walk.price, 0)
    if walk.j == 0:
        walk.level.queue.popleft()
    else:
        walk.j += 1
