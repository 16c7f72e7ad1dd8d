"""The order book of one device class and plan: a price ladder per side and terms, matching.

Internal to the engine (use `MatchingEngine`). Each side keeps one ladder per terms (SLO and
memory) its resting orders carry (`market.engine.ladders`). A taker walks only the ladders
whose terms it can trade with, merged by price and then sequence: the priority among the
orders it can trade with is the one a single queue per price gives, and the orders it cannot
trade with cost it nothing however many rest at crossing prices. Each side also keeps its live
units and orders per price over all terms, for its best price and depth. Cancels, expiries and
fills behind a skipped order are lazy: the entry is marked dead and dropped when it reaches the
head of its queue, when its level empties, or when the queue is compacted.
"""

from __future__ import annotations

from bisect import bisect_left
from collections import deque
from typing import NamedTuple

from market.engine.fills import Fill
from market.engine.gate import Gate
from market.engine.ladders import (
    COMPACT_SLACK,
    BookEntry,
    BookSide,
    Walk,
    first_walk,
    next_ask,
    next_bid,
    take_filled,
)
from market.engine.lifecycle import OrderState
from market.engine.orders import Side

_BID = Side.BID
_ASK = Side.ASK
_PARTIALLY_FILLED = OrderState.PARTIALLY_FILLED
_FILLED = OrderState.FILLED


class PriceLevel(NamedTuple):
    """Aggregate of one price level on one side: live units and live orders at that price."""

    price: int
    quantity: int
    orders: int


class Book:
    """Both sides of the book of one device class and one plan.

    Orders of different plans never trade (see `compatible`), so the engine keeps one book per
    (device class, plan); within it, one ladder per terms (see the module docstring).
    """

    __slots__ = ("_asks", "_bids", "device_class", "plan")

    def __init__(self, device_class: str, plan: str) -> None:
        """Create an empty book for `device_class` and `plan`."""
        self.device_class = device_class
        self.plan = plan
        self._bids = BookSide()
        self._asks = BookSide()

    # -- matching ---------------------------------------------------------------------------

    def place_bid(
        self, taker: BookEntry, now: int, fill_id: int, gate: Gate | None = None
    ) -> list[Fill]:
        """Match incoming bid `taker`, rest what is left; return fills numbered from `fill_id`.

        Takes asks from the lowest price up to the bid's limit, earliest first at each price,
        among the ladders whose terms the bid can use (`compatible(bid, ask)`: the ask's SLO at
        most the bid's, its memory at least the bid's), skipping dead and expired (`expiry <=
        now`) asks and, with a `gate`, asks of providers it says are not live. A fill takes
        what the gate lets the bid's owner pay for; once that falls short, matching stops
        (higher prices cannot be paid either) and the rest of the bid rests. Updates the
        resting asks and the taker (remaining units, state, and `live` if it rests).
        """
        fills: list[Fill] = []
        limit = taker.price
        asks = self._asks
        if asks.prices and asks.prices[0] <= limit:
            need_slo_ms = taker.slo_ms
            need_memory = taker.memory
            walks: list[Walk] = []
            for ladder in list(asks.ladders.values()):
                if ladder.slo_ms > need_slo_ms or ladder.memory < need_memory:
                    continue
                if ladder.prices[0] > limit:
                    continue
                walk = Walk(ladder, 0, taker)
                if next_ask(asks, walk, now, limit, gate):
                    walks.append(walk)
            buyer = taker.owner
            bid_id = taker.order_id
            device_class = self.device_class
            remaining = taker.remaining
            while walks:
                best = first_walk(walks, highest=False)
                entry = best.entry
                price = best.price
                available = entry.remaining
                qty = remaining if remaining < available else available
                broke = False
                if gate is not None:
                    wanted = qty
                    qty = gate.bid_units(buyer, price, wanted)
                    if qty < wanted:
                        broke = True
                        if qty <= 0:
                            break
                remaining -= qty
                best.level.quantity -= qty
                asks.totals[price].quantity -= qty
                fills.append(
                    Fill(fill_id, device_class, bid_id, entry.order_id, price, qty, _BID, now)
                )
                fill_id += 1
                if available > qty:
                    # OPEN | PARTIALLY_FILLED -> PARTIALLY_FILLED; the taker is exhausted
                    # (or cannot pay for more).
                    entry.remaining = available - qty
                    entry.state = _PARTIALLY_FILLED
                    break
                take_filled(asks, best, entry)
                if not remaining or broke:
                    if best.level.count == 0:
                        asks.drop_level(best.ladder, best.i)
                    break
                if not next_ask(asks, best, now, limit, gate):
                    walks.remove(best)
            if fills:
                taker.remaining = remaining
                if not remaining:
                    taker.state = _FILLED  # OPEN -> FILLED
                    return fills
                taker.state = _PARTIALLY_FILLED  # OPEN -> PARTIALLY_FILLED
        self._bids.add(taker)
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
        bids = self._bids
        if (
            bids.prices
            and bids.prices[-1] >= limit
            and (gate is None or gate.ask_live(taker.owner))
        ):
            offer_slo_ms = taker.slo_ms
            offer_memory = taker.memory
            walks: list[Walk] = []
            for ladder in list(bids.ladders.values()):
                if ladder.slo_ms < offer_slo_ms or ladder.memory > offer_memory:
                    continue
                if ladder.prices[-1] < limit:
                    continue
                walk = Walk(ladder, len(ladder.prices) - 1, taker)
                if next_bid(bids, walk, now, limit):
                    walks.append(walk)
            ask_id = taker.order_id
            device_class = self.device_class
            remaining = taker.remaining
            while walks:
                best = first_walk(walks, highest=True)
                entry = best.entry
                price = best.price
                available = entry.remaining
                qty = remaining if remaining < available else available
                if gate is not None:
                    qty = gate.bid_units(entry.owner, price, qty)
                    if qty <= 0:
                        best.j += 1
                        if not next_bid(bids, best, now, limit):
                            walks.remove(best)
                        continue
                remaining -= qty
                best.level.quantity -= qty
                bids.totals[price].quantity -= qty
                fills.append(
                    Fill(fill_id, device_class, entry.order_id, ask_id, price, qty, _ASK, now)
                )
                fill_id += 1
                if available > qty:
                    entry.remaining = available - qty
                    entry.state = _PARTIALLY_FILLED
                    if not remaining:
                        break
                    best.j += 1  # its owner could pay for no more: the taker goes on
                else:
                    take_filled(bids, best, entry)
                    if not remaining:
                        if best.level.count == 0:
                            bids.drop_level(best.ladder, best.i)
                        break
                if not next_bid(bids, best, now, limit):
                    walks.remove(best)
            if fills:
                taker.remaining = remaining
                if not remaining:
                    taker.state = _FILLED
                    return fills
                taker.state = _PARTIALLY_FILLED
        self._asks.add(taker)
        return fills

    # -- matching again -----------------------------------------------------------------------

    def crossing(self, now: int) -> list[BookEntry]:
        """Return the live, unexpired entries priced through the other side's best price, by
        sequence: the orders a gate held back (or incompatible ones) that may trade now."""
        bid_prices, ask_prices = self._bids.prices, self._asks.prices
        if not bid_prices or not ask_prices or bid_prices[-1] < ask_prices[0]:
            return []
        best_bid, best_ask = bid_prices[-1], ask_prices[0]
        found: list[BookEntry] = []
        for ladder in self._asks.ladders.values():
            for price in ladder.prices:
                if price > best_bid:
                    break
                found.extend(e for e in ladder.levels[price].queue if e.live and e.expiry > now)
        for ladder in self._bids.ladders.values():
            for price in reversed(ladder.prices):
                if price < best_ask:
                    break
                found.extend(e for e in ladder.levels[price].queue if e.live and e.expiry > now)
        found.sort(key=_seq_of)
        return found

    def rematch(
        self, entry: BookEntry, now: int, fill_id: int, gate: Gate | None = None
    ) -> list[Fill]:
        """Match resting `entry` against the other side as if it arrived at `now` (what held it
        back, a gate's word on its owner or on its counterparts, may have changed); return the
        fills numbered from `fill_id`, each at the other order's price. What is left rests
        where it was in its level's time priority."""
        self._take_out(entry, from_queue=True)
        if entry.is_bid:
            fills = self.place_bid(entry, now, fill_id, gate)
        else:
            fills = self.place_ask(entry, now, fill_id, gate)
        ladder = entry.ladder
        if entry.live and ladder is not None:  # it rests at the back of its level
            queue = ladder.levels[entry.price].queue  # back to its place by sequence
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
        (self._bids if entry.is_bid else self._asks).add(entry)

    def remove(self, entry: BookEntry) -> None:
        """Take live `entry` out of the book (cancel or expiry); the caller sets its state."""
        self._take_out(entry, from_queue=False)

    def _take_out(self, entry: BookEntry, *, from_queue: bool) -> None:
        """Count live `entry` out of its level and the totals; take it out of its queue now
        (`from_queue`) or lazily."""
        side = self._bids if entry.is_bid else self._asks
        ladder = entry.ladder
        assert ladder is not None
        price = entry.price
        level = ladder.levels[price]
        entry.live = False
        level.quantity -= entry.remaining
        level.count -= 1
        side.count_out(price, entry.remaining)
        queue = level.queue
        if level.count == 0:
            side.drop_level(ladder, bisect_left(ladder.prices, price))
        elif from_queue:
            queue.remove(entry)
        elif queue[0] is entry:
            queue.popleft()
        elif len(queue) > 2 * level.count + COMPACT_SLACK:
            level.queue = deque([e for e in queue if e.live])

    # -- queries ------------------------------------------------------------------------------

    def best(self, side: Side) -> int | None:
        """Return the best price with a live order on `side`, or None if that side is empty."""
        if side is _BID:
            return self._bids.prices[-1] if self._bids.prices else None
        return self._asks.prices[0] if self._asks.prices else None

    def depth(self, side: Side, limit: int | None = None) -> list[PriceLevel]:
        """Return up to `limit` price levels of `side`, best first."""
        if side is _BID:
            totals = self._bids.totals
            prices = self._bids.prices[::-1]
        else:
            totals = self._asks.totals
            prices = self._asks.prices
        if limit is not None:
            prices = prices[:limit]
        return [PriceLevel(p, totals[p].quantity, totals[p].count) for p in prices]

    def live_entries(self, side: Side) -> list[BookEntry]:
        """Return the live entries of `side` in priority order (best price, then earliest)."""
        ladders = (self._bids if side is _BID else self._asks).ladders.values()
        found = [e for lad in ladders for p in lad.prices for e in lad.levels[p].queue if e.live]
        if side is _BID:
            found.sort(key=_bid_priority)
        else:
            found.sort(key=_ask_priority)
        return found

    def __len__(self) -> int:
        """Return the number of live orders on both sides."""
        return sum(t.count for t in self._bids.totals.values()) + sum(
            t.count for t in self._asks.totals.values()
        )


def _bid_priority(entry: BookEntry) -> tuple[int, int]:
    return (-entry.price, entry.seq)


def _ask_priority(entry: BookEntry) -> tuple[int, int]:
    return (entry.price, entry.seq)


def _seq_of(entry: BookEntry) -> int:
    return entry.seq
