"""The order book of one device class and plan: price levels per side, FIFO queues, matching.

Internal to the engine (use `MatchingEngine`). Each side keeps a dict from price to level and a
sorted list of the prices that have at least one live order (ascending on both sides: the best
ask is first, the best bid last). A level is a FIFO queue of entries in time priority. Cancels,
expiries and fills behind an incompatible order are lazy: the entry is marked dead and dropped
when it reaches the head of its queue, when its level empties, or when the queue is compacted.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections import deque
from typing import NamedTuple

from market.engine.fills import Fill
from market.engine.gate import Gate
from market.engine.lifecycle import OrderState
from market.engine.orders import Order, Side

_BID = Side.BID
_ASK = Side.ASK
_OPEN = OrderState.OPEN
_PARTIALLY_FILLED = OrderState.PARTIALLY_FILLED
_FILLED = OrderState.FILLED

# Rebuild a queue without its dead entries once they outnumber the live ones by this much.
_COMPACT_SLACK = 32


class PriceLevel(NamedTuple):
    """Aggregate of one price level on one side: live units and live orders at that price."""

    price: int
    quantity: int
    orders: int


class BookEntry:
    """Mutable engine state of one order; `live` is True while it rests and can trade.

    Holds copies of the order fields the matching loops read (price, SLO, memory, id, side), so
    the hot paths never reach through to the `Order`.
    """

    __slots__ = (
        "book",
        "expiry",
        "is_bid",
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


class _Level:
    __slots__ = ("count", "quantity", "queue")

    def __init__(self) -> None:
        self.queue: deque[BookEntry] = deque()
        self.quantity = 0
        self.count = 0


class Book:
    """Both sides of the book of one device class and one plan.

    Orders of different plans never trade (see `compatible`), so the engine keeps one book per
    (device class, plan): matching then never scans orders of another plan, and priority among
    the orders that can trade is unchanged.
    """

    __slots__ = ("_ask_levels", "_ask_prices", "_bid_levels", "_bid_prices", "device_class", "plan")

    def __init__(self, device_class: str, plan: str) -> None:
        """Create an empty book for `device_class` and `plan`."""
        self.device_class = device_class
        self.plan = plan
        self._bid_levels: dict[int, _Level] = {}
        self._bid_prices: list[int] = []
        self._ask_levels: dict[int, _Level] = {}
        self._ask_prices: list[int] = []

    # -- matching ---------------------------------------------------------------------------

    def place_bid(
        self, taker: BookEntry, now: int, fill_id: int, gate: Gate | None = None
    ) -> list[Fill]:
        """Match incoming bid `taker`, rest what is left; return fills numbered from `fill_id`.

        Scans ask levels from the lowest price up to the bid's limit and each level's queue in
        time order, skipping dead, expired (`expiry <= now`) and incompatible asks, and with a
        `gate`, asks of providers it says are not live. A fill takes what the gate lets the
        bid's owner pay for; once that falls short, matching stops (higher prices cannot be
        paid either) and the rest of the bid rests. Updates the resting asks and the taker
        (remaining units, state, and `live` if it rests).
        """
        fills: list[Fill] = []
        limit = taker.price
        prices = self._ask_prices
        if prices and prices[0] <= limit:
            buyer = taker.owner
            broke = False
            levels = self._ask_levels
            bid_id = taker.order_id
            # `compatible(bid, ask)` within one book, whose orders all share a plan.
            need_slo_ms = taker.slo_ms
            need_memory = taker.memory
            remaining = taker.remaining
            device_class = self.device_class
            i = 0
            n_prices = len(prices)
            while i < n_prices:
                price = prices[i]
                if price > limit:
                    break
                level = levels[price]
                queue = level.queue
                n = len(queue)
                j = 0
                while j < n:
                    entry = queue[j]
                    if not entry.live:
                        if j == 0:
                            queue.popleft()
                            n -= 1
                        else:
                            j += 1
                        continue
                    if (
                        entry.expiry <= now
                        or entry.slo_ms > need_slo_ms
                        or entry.memory < need_memory
                    ):
                        j += 1
                        continue
                    available = entry.remaining
                    qty = remaining if remaining < available else available
                    if gate is not None:
                        if not gate.ask_live(entry.owner):
                            j += 1
                            continue
                        wanted = qty
                        qty = gate.bid_units(buyer, price, wanted)
                        if qty < wanted:
                            broke = True
                            if qty <= 0:
                                break
                    remaining -= qty
                    level.quantity -= qty
                    fills.append(
                        Fill(
                            fill_id,
                            device_class,
                            bid_id,
                            entry.order_id,
                            price,
                            qty,
                            _BID,
                            now,
                        )
                    )
                    fill_id += 1
                    if available > qty:
                        # OPEN | PARTIALLY_FILLED -> PARTIALLY_FILLED; the taker is exhausted
                        # (or cannot pay for more).
                        entry.remaining = available - qty
                        entry.state = _PARTIALLY_FILLED
                        break
                    # OPEN | PARTIALLY_FILLED -> FILLED.
                    entry.remaining = 0
                    entry.state = _FILLED
                    entry.live = False
                    level.count -= 1
                    if j == 0:
                        queue.popleft()
                        n -= 1
                    else:
                        j += 1
                    if not remaining or broke:
                        break
                if level.count == 0:
                    del levels[price]
                    del prices[i]
                    n_prices -= 1
                else:
                    if n > 2 * level.count + _COMPACT_SLACK:
                        level.queue = deque([e for e in queue if e.live])
                    i += 1
                if not remaining or broke:
                    break
            if fills:
                taker.remaining = remaining
                if not remaining:
                    taker.state = _FILLED  # OPEN -> FILLED
                    return fills
                taker.state = _PARTIALLY_FILLED  # OPEN -> PARTIALLY_FILLED
        own_levels = self._bid_levels
        home = own_levels.get(limit)
        if home is None:
            home = own_levels[limit] = _Level()
            insort(self._bid_prices, limit)
        home.queue.append(taker)
        home.quantity += taker.remaining
        home.count += 1
        taker.live = True
        return fills

    def place_ask(
        self, taker: BookEntry, now: int, fill_id: int, gate: Gate | None = None
    ) -> list[Fill]:
        """Match incoming ask `taker` against resting bids; mirror image of `place_bid`.

        With a `gate`, an ask of a provider that is not live only rests, and each resting bid
        takes what the gate lets its owner pay for (a bid that can pay for nothing is skipped).
        """
        fills: list[Fill] = []
        limit = taker.price
        prices = self._bid_prices
        if prices and prices[-1] >= limit and (gate is None or gate.ask_live(taker.owner)):
            levels = self._bid_levels
            ask_id = taker.order_id
            # `compatible(bid, ask)` within one book, whose orders all share a plan.
            offer_slo_ms = taker.slo_ms
            offer_memory = taker.memory
            remaining = taker.remaining
            device_class = self.device_class
            i = len(prices) - 1
            while i >= 0:
                price = prices[i]
                if price < limit:
                    break
                level = levels[price]
                queue = level.queue
                n = len(queue)
                j = 0
                while j < n:
                    entry = queue[j]
                    if not entry.live:
                        if j == 0:
                            queue.popleft()
                            n -= 1
                        else:
                            j += 1
                        continue
                    if (
                        entry.expiry <= now
                        or entry.slo_ms < offer_slo_ms
                        or entry.memory > offer_memory
                    ):
                        j += 1
                        continue
                    available = entry.remaining
                    qty = remaining if remaining < available else available
                    if gate is not None:
                        qty = gate.bid_units(entry.owner, price, qty)
                        if qty <= 0:
                            j += 1
                            continue
                    remaining -= qty
                    level.quantity -= qty
                    fills.append(
                        Fill(
                            fill_id,
                            device_class,
                            entry.order_id,
                            ask_id,
                            price,
                            qty,
                            _ASK,
                            now,
                        )
                    )
                    fill_id += 1
                    if available > qty:
                        entry.remaining = available - qty
                        entry.state = _PARTIALLY_FILLED
                        if not remaining:
                            break
                        j += 1  # its owner could pay for no more: the taker goes on
                        continue
                    entry.remaining = 0
                    entry.state = _FILLED
                    entry.live = False
                    level.count -= 1
                    if j == 0:
                        queue.popleft()
                        n -= 1
                    else:
                        j += 1
                    if not remaining:
                        break
                if level.count == 0:
                    del levels[price]
                    del prices[i]
                elif n > 2 * level.count + _COMPACT_SLACK:
                    level.queue = deque([e for e in queue if e.live])
                if not remaining:
                    break
                i -= 1
            if fills:
                taker.remaining = remaining
                if not remaining:
                    taker.state = _FILLED
                    return fills
                taker.state = _PARTIALLY_FILLED
        own_levels = self._ask_levels
        home = own_levels.get(limit)
        if home is None:
            home = own_levels[limit] = _Level()
            insort(self._ask_prices, limit)
        home.queue.append(taker)
        home.quantity += taker.remaining
        home.count += 1
        taker.live = True
        return fills

    # -- matching again -----------------------------------------------------------------------

    def crossing(self, now: int) -> list[BookEntry]:
        """Return the live, unexpired entries priced through the other side's best price, by
        sequence: the orders a gate held back (or incompatible ones) that may trade now."""
        bid_prices, ask_prices = self._bid_prices, self._ask_prices
        if not bid_prices or not ask_prices or bid_prices[-1] < ask_prices[0]:
            return []
        best_bid, best_ask = bid_prices[-1], ask_prices[0]
        found: list[BookEntry] = []
        for price in ask_prices:
            if price > best_bid:
                break
            found.extend(e for e in self._ask_levels[price].queue if e.live and e.expiry > now)
        for price in reversed(bid_prices):
            if price < best_ask:
                break
            found.extend(e for e in self._bid_levels[price].queue if e.live and e.expiry > now)
        found.sort(key=_seq_of)
        return found

    def rematch(
        self, entry: BookEntry, now: int, fill_id: int, gate: Gate | None = None
    ) -> list[Fill]:
        """Match resting `entry` against the other side as if it arrived at `now` (what held it
        back, a gate's word on its owner or on its counterparts, may have changed); return the
        fills numbered from `fill_id`, each at the other order's price. What is left rests
        where it was in its level's time priority."""
        if entry.is_bid:
            levels, prices = self._bid_levels, self._bid_prices
        else:
            levels, prices = self._ask_levels, self._ask_prices
        price = entry.price
        level = levels[price]
        level.queue.remove(entry)  # out of the queue for good: it is placed again below
        level.quantity -= entry.remaining
        level.count -= 1
        if level.count == 0:
            del levels[price]
            del prices[bisect_left(prices, price)]
        entry.live = False
        if entry.is_bid:
            fills = self.place_bid(entry, now, fill_id, gate)
        else:
            fills = self.place_ask(entry, now, fill_id, gate)
        if entry.live:  # it rests at the back of its level: back to its place by sequence
            queue = levels[price].queue
            if len(queue) > 1 and queue[-2].seq > entry.seq:
                queue.pop()
                for index, other in enumerate(queue):
                    if other.seq > entry.seq:
                        queue.insert(index, entry)
                        break
        return fills

    # -- resting and removal ------------------------------------------------------------------

    def rest(self, entry: BookEntry) -> None:
        """Append live `entry` to the back of its price level's queue."""
        if entry.is_bid:
            levels, prices = self._bid_levels, self._bid_prices
        else:
            levels, prices = self._ask_levels, self._ask_prices
        price = entry.price
        level = levels.get(price)
        if level is None:
            level = levels[price] = _Level()
            insort(prices, price)
        level.queue.append(entry)
        level.quantity += entry.remaining
        level.count += 1
        entry.live = True

    def remove(self, entry: BookEntry) -> None:
        """Take live `entry` out of the book (cancel or expiry); the caller sets its state."""
        if entry.is_bid:
            levels, prices = self._bid_levels, self._bid_prices
        else:
            levels, prices = self._ask_levels, self._ask_prices
        price = entry.price
        level = levels[price]
        entry.live = False
        level.quantity -= entry.remaining
        level.count -= 1
        if level.count == 0:
            del levels[price]
            del prices[bisect_left(prices, price)]
            return
        queue = level.queue
        if queue[0] is entry:
            queue.popleft()
        elif len(queue) > 2 * level.count + _COMPACT_SLACK:
            level.queue = deque([e for e in queue if e.live])

    # -- queries ------------------------------------------------------------------------------

    def best(self, side: Side) -> int | None:
        """Return the best price with a live order on `side`, or None if that side is empty."""
        if side is _BID:
            return self._bid_prices[-1] if self._bid_prices else None
        return self._ask_prices[0] if self._ask_prices else None

    def depth(self, side: Side, limit: int | None = None) -> list[PriceLevel]:
        """Return up to `limit` price levels of `side`, best first."""
        if side is _BID:
            levels = self._bid_levels
            prices = self._bid_prices[::-1] if limit is None else self._bid_prices[::-1][:limit]
        else:
            levels = self._ask_levels
            prices = self._ask_prices if limit is None else self._ask_prices[:limit]
        return [PriceLevel(p, levels[p].quantity, levels[p].count) for p in prices]

    def live_entries(self, side: Side) -> list[BookEntry]:
        """Return the live entries of `side` in priority order (best price, then earliest)."""
        if side is _BID:
            levels, prices = self._bid_levels, self._bid_prices[::-1]
        else:
            levels, prices = self._ask_levels, self._ask_prices
        return [e for p in prices for e in levels[p].queue if e.live]

    def __len__(self) -> int:
        """Return the number of live orders on both sides."""
        return sum(lv.count for lv in self._bid_levels.values()) + sum(
            lv.count for lv in self._ask_levels.values()
        )


def _seq_of(entry: BookEntry) -> int:
    return entry.seq
