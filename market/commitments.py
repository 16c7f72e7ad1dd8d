"""What each account has committed on this market, kept in memory and changed incrementally.

The funds check (`market.funds`) needs, per signer: how many orders it has live, the unfilled
spend of its live bids (price x remaining), the device classes of its live asks, and the spend
of its deals matched within `hold_s` and not open on chain. `Commitments` keeps those figures
per account and changes them as the writer commits (`apply`: new orders, fills, deals; cancels
and expiries through `progress`), as the indexer sees deals open (`opened`) and as deals age
out of the hold (a heap, popped when read). Nothing on the order path reads SQL or scans an
account's history: a check is a few dictionary reads.

The figures equal a from-scratch recomputation over the stored rows (`Commitments.load` on a
fresh instance; tested by a stateful property test): an order counts while its stored state is
live (an order past its expiry counts until the expiry job records it, at most
`expire_every_s`, which only errs on refusing), a cancelled order counts against its owner's
live-order quota until its expiry (the market remembers it until then), a deal while it is
unopened and younger than `hold_s`.
"""

from __future__ import annotations

import heapq
import threading
from collections.abc import Collection, Iterable, Sequence
from typing import NamedTuple

from sqlalchemy.engine import Connection

from market.storage import DEVICE_CLASSES_SQL, placeholder

LIVE = frozenset(("open", "partially_filled"))

# Positions in a stored `orders` row as the writer builds it (`market.storage.ORDER_COLUMNS`).
_SIDE, _ID, _OWNER, _CLASS, _PRICE, _EXPIRY, _STATE, _REMAINING = 0, 1, 2, 3, 5, 9, 12, 13
# Positions in a `deals` row (`market.storage.DEAL_COLUMNS`).
_DEAL_ID, _CLIENT, _DEAL_PRICE, _DEAL_QUANTITY, _DEAL_CREATED = 0, 4, 6, 7, 9


# A live order as kept: (owner, is bid, price, remaining, device class, expiry). A plain tuple,
# not a named one: one is kept per live order, and the cyclic collector stops tracking a plain
# tuple of plain values (so full collections do not walk them) but never a named tuple.
_Live = tuple[str, bool, int, int, str, int]


class Figures(NamedTuple):
    """One account's commitments: live orders, live bids' unfilled spend, unopened deals' spend,
    live asks' device classes, cancelled orders whose expiry has not passed."""

    live: int
    bid_spend: int
    deal_spend: int
    ask_classes: frozenset[str]
    cancelled: int


class Commitments:
    """Per-account commitments (see the module); thread-safe, every call O(1) amortized."""

    def __init__(self, hold_s: float) -> None:
        """Count a matched deal for `hold_s` seconds after its match, unless it opens."""
        self.hold_s = hold_s
        self._lock = threading.Lock()
        self._orders: dict[str, _Live] = {}  # live orders by id
        self._live: dict[str, int] = {}  # owner -> live orders
        self._bid_spend: dict[str, int] = {}  # owner -> unfilled spend of its live bids
        self._ask_classes: dict[str, dict[str, int]] = {}  # owner -> class -> live asks
        self._deals: dict[str, tuple[str, int, float]] = {}  # unopened: id -> (client, spend, at)
        self._deal_spend: dict[str, int] = {}  # client -> spend of its unopened deals
        self._client_deals: dict[str, set[str]] = {}  # client -> ids of its unopened deals
        self._due: list[tuple[float, str]] = []  # (created_at + hold_s, deal id)
        self._cancelled: dict[str, int] = {}  # owner -> cancelled orders not yet past expiry
        self._cancel_due: list[tuple[int, str]] = []  # (expiry, owner) of cancelled orders
        self.released = 0  # deals that stopped counting (opened, aged out): bids may trade now

    # -- loading and recomputing ------------------------------------------------------------

    @classmethod
    def load(
        cls,
        connection: Connection,
        now: float,
        hold_s: float,
        classes: Collection[str] | None = None,
    ) -> Commitments:
        """Return the commitments the stored rows show at `now` (live orders, deals matched
        since `now - hold_s` and not open on chain): what a restart starts from, and the
        from-scratch figure the incremental one must equal. With `classes`, only those device
        classes' (a process serving them, `market.partition`)."""
        commitments = cls(hold_s)
        mine = (lambda _name: True) if classes is None else frozenset(classes).__contains__
        orders = connection.exec_driver_sql(
            "SELECT order_id, owner, side, price, remaining, device_class, expiry FROM orders "
            "WHERE state IN ('open', 'partially_filled')"
        )
        for order_id, owner, side, price, remaining, klass, expiry in orders:
            if not mine(klass):
                continue
            commitments._add(
                order_id, owner, side == "bid", int(price), int(remaining), klass, int(expiry)
            )
        mark = placeholder(connection)
        # By class, so the class+state index serves it (a scan of every order otherwise).
        for (name,) in list(connection.exec_driver_sql(DEVICE_CLASSES_SQL)):
            if not mine(name):
                continue
            cancelled = connection.exec_driver_sql(
                f"SELECT owner, expiry FROM orders WHERE device_class = {mark} "
                f"AND state = 'cancelled' AND expiry > {mark}",
                (name, int(now)),
            )
            for owner, expiry in cancelled:
                commitments._cancel(owner, int(expiry))
        deals = connection.exec_driver_sql(
            "SELECT deal_id, client, price, quantity, created_at, device_class FROM deals "
            f"WHERE chain_deal_id IS NULL AND created_at >= {mark}",
            (now - hold_s,),
        )
        for deal_id, client, price, quantity, created_at, klass in deals:
            if not mine(klass):
                continue
            commitments._deal(deal_id, client, int(price) * int(quantity), float(created_at))
        return commitments

    # -- changes ----------------------------------------------------------------------------

    def apply(
        self,
        orders: Sequence[tuple[object, ...]],
        updates: Iterable[tuple[str, str, int]],
        deals: Sequence[tuple[object, ...]],
    ) -> None:
        """Count one committed write: new order rows (their state after the write), orders'
        progress (id, state, remaining), new deal rows (`market.placement.Rows`)."""
        with self._lock:
            for row in orders:
                if row[_STATE] in LIVE:
                    self._add(
                        str(row[_ID]),
                        str(row[_OWNER]),
                        row[_SIDE] == "bid",
                        int(row[_PRICE]),  # type: ignore[call-overload]
                        int(row[_REMAINING]),  # type: ignore[call-overload]
                        str(row[_CLASS]),
                        int(row[_EXPIRY]),  # type: ignore[call-overload]
                    )
            for order_id, state, remaining in updates:
                self._progress(order_id, state, remaining)
            for d in deals:
                spend = int(d[_DEAL_PRICE]) * int(d[_DEAL_QUANTITY])  # type: ignore[call-overload]
                self._deal(str(d[_DEAL_ID]), str(d[_CLIENT]), spend, float(d[_DEAL_CREATED]))  # type: ignore[arg-type]

    def progress(self, updates: Iterable[tuple[str, str, int]]) -> None:
        """Count committed changes of orders (a cancel, the expiry job): (id, state, remaining)."""
        with self._lock:
            for order_id, state, remaining in updates:
                self._progress(order_id, state, remaining)

    def opened(self, deal_ids: Iterable[str]) -> None:
        """Stop counting deals now open on chain (the escrow locks their funds instead)."""
        with self._lock:
            for deal_id in deal_ids:
                self._drop_deal(deal_id)

    # -- reads ------------------------------------------------------------------------------

    def figures(self, owner: str, now: float) -> Figures:
        """Return `owner`'s commitments at `now`."""
        with self._lock:
            self._age(now)
            classes = self._ask_classes.get(owner)
            return Figures(
                self._live.get(owner, 0),
                self._bid_spend.get(owner, 0),
                self._deal_spend.get(owner, 0),
                frozenset(classes) if classes else frozenset(),
                self._cancelled.get(owner, 0),
            )

    def committed(self, owner: str, now: float) -> int:
        """Return what `owner`'s live bids and unopened deals commit of its balance at `now`."""
        figures = self.figures(owner, now)
        return figures.bid_spend + figures.deal_spend

    def unopened_spend(self, client: str, now: float) -> int:
        """Return the spend of `client`'s deals matched within `hold_s` and not open."""
        with self._lock:
            self._age(now)
            return self._deal_spend.get(client, 0)

    def unopened_deals(self, clients: Collection[str]) -> list[str]:
        """Return the ids of the unopened deals (still counted) of `clients`."""
        with self._lock:
            return [d for c in clients for d in self._client_deals.get(c, ())]

    def holders(self, accounts: Iterable[str]) -> tuple[set[str], set[str]]:
        """Return which of `accounts` own live bids, and which own live asks."""
        with self._lock:
            bidders = {a for a in accounts if self._bid_spend.get(a)}
            askers = {a for a in accounts if self._ask_classes.get(a)}
        return bidders, askers

    def bidders(self) -> list[str]:
        """Return the owners of live bids, sorted."""
        with self._lock:
            return sorted(self._bid_spend)

    def state(self, now: float) -> dict[str, Figures]:
        """Return every account's figures at `now` (accounts with nothing left out)."""
        with self._lock:
            self._age(now)
            owners = set(self._live) | set(self._deal_spend) | set(self._cancelled)
        return {o: self.figures(o, now) for o in sorted(owners)}

    def __len__(self) -> int:
        """Return how many live orders are counted."""
        return len(self._orders)

    # -- under the lock ---------------------------------------------------------------------

    def _add(
        self,
        order_id: str,
        owner: str,
        is_bid: bool,
        price: int,
        remaining: int,
        klass: str,
        expiry: int,
    ) -> None:
        if order_id in self._orders:
            return
        self._orders[order_id] = (owner, is_bid, price, remaining, klass, expiry)
        self._live[owner] = self._live.get(owner, 0) + 1
        if is_bid:
            self._bid_spend[owner] = self._bid_spend.get(owner, 0) + price * remaining
        else:
            classes = self._ask_classes.setdefault(owner, {})
            classes[klass] = classes.get(klass, 0) + 1

    def _progress(self, order_id: str, state: str, remaining: int) -> None:
        held = self._orders.get(order_id)
        if held is None:
            return
        owner, is_bid, price, was, klass, expiry = held
        if is_bid:
            spend = self._bid_spend[owner] - price * was
            if state in LIVE:
                spend += price * remaining
            _set(self._bid_spend, owner, spend)
        if state in LIVE:
            self._orders[order_id] = (owner, is_bid, price, remaining, klass, expiry)
            return
        del self._orders[order_id]
        _set(self._live, owner, self._live[owner] - 1)
        if state == "cancelled":
            self._cancel(owner, expiry)
        if not is_bid:
            classes = self._ask_classes[owner]
            _set(classes, klass, classes[klass] - 1)
            if not classes:
                del self._ask_classes[owner]

    def _cancel(self, owner: str, expiry: int) -> None:
        """Count a cancelled order against its owner's quota until its expiry (it stays
        remembered until then: a cancel must not be a free way to fill memory)."""
        self._cancelled[owner] = self._cancelled.get(owner, 0) + 1
        heapq.heappush(self._cancel_due, (expiry, owner))

    def _deal(self, deal_id: str, client: str, spend: int, created_at: float) -> None:
        if deal_id in self._deals:
            return
        self._deals[deal_id] = (client, spend, created_at)
        self._deal_spend[client] = self._deal_spend.get(client, 0) + spend
        self._client_deals.setdefault(client, set()).add(deal_id)
        heapq.heappush(self._due, (created_at + self.hold_s, deal_id))

    def _drop_deal(self, deal_id: str) -> None:
        held = self._deals.pop(deal_id, None)
        if held is None:
            return
        client, spend, _ = held
        self.released += 1
        _set(self._deal_spend, client, self._deal_spend[client] - spend)
        ids = self._client_deals[client]
        ids.discard(deal_id)
        if not ids:
            del self._client_deals[client]

    def _age(self, now: float) -> None:
        """Stop counting deals matched before `now - hold_s` (the SQL figure's cut-off) and
        cancelled orders whose expiry passed."""
        due = self._due
        while due and due[0][0] < now:
            self._drop_deal(heapq.heappop(due)[1])
        cancels = self._cancel_due
        while cancels and cancels[0][0] <= now:
            owner = heapq.heappop(cancels)[1]
            _set(self._cancelled, owner, self._cancelled[owner] - 1)


def _set(counts: dict[str, int], key: str, value: int) -> None:
    if value:
        counts[key] = value
    else:
        counts.pop(key, None)
