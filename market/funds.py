"""Funds behind orders: what a signer must hold on the escrow before the market takes its word.

A signature costs nothing to make; escrow balances and stakes do. When the market knows its
escrow (`MarketService.knows_escrow`) and `Settings.require_funds` is on, `FundsGuard` admits:

- a **bid** only if its signer's free escrow balance (`balanceOf`) covers the bid's spend
  (price x quantity) on top of what the signer already committed on this market: the unfilled
  part of its live bids and the spend of its matched deals not yet open on chain (for
  `unopened_deal_hold_s` after the match; an opened deal's funds are locked on chain instead);
- an **ask** only if its signer's free stake (`stakeOf`) covers both the market's minimum
  (`min_provider_stake`) and the stake its quote promises, and the signer keeps at most
  `max_classes_per_provider` device classes in live asks;
- a **heartbeat** only if the provider's stake, free or locked in its open deals (indexed),
  reaches `min_provider_stake`;
- an **order** of either side only in a device class that exists: one with a book (an ask from
  a staked provider made it) or advertised by a registered (so staked) provider; and at most
  `max_live_orders_per_owner` live orders per signer.

Balances and stakes are read from the escrow and cached for `funds_cache_s`; a refusal is
decided on a figure read for it (a client that just deposited is never refused on a stale one;
a flood of unfunded orders costs one read each, within the signer's and the IP's rate limits).
The cached figures the book shows by (`market.bidders`) and a heartbeat may be admitted on are
refreshed two ways: after each indexer run, `FundsGuard.reread` reads again the figures of the
accounts whose balance or stake the run's escrow events moved, if they hold something on the
market (live bids: the balance; live asks or a registration: the stake), at most one read per
account and figure whatever the events (an account with nothing live costs no read, however
many deposits it makes); and a backstop pass reads each live bidder's balance again in turn
(`PayingBidders.refresh`) for anything the events miss.
What a request reserves is held in memory until its orders are committed (then the database
shows them), so two requests of one signer racing each other cannot both spend one balance.
Refusals are `UnfundedError` or `QuotaError` (403), with the figures that decided them.

Admission is not enough: a wallet can withdraw after its bid rests, and a provider's daemon can
stop after its ask rests. So the writer also matches each group through a `MatchGate` (the
engine's `market.engine.gate.Gate`): a bid fills only as far as its owner's free escrow balance
covers the spend of its matched deals not yet open plus this fill (its resting bids are not
counted again: they are what is filling), and an ask trades only while its provider's last
heartbeat is younger than `provider_ttl_s`. What cannot trade rests: an empty wallet's bid
never fills, and a silent provider's ask matches again once it heartbeats. A match's spend
stops counting when its deal opens on chain (the escrow locks it) or `unopened_deal_hold_s`
after the match (it expired unopened).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Collection, Sequence
from contextlib import AbstractContextManager
from typing import Any, NamedTuple

from sqlmodel import Session, col, select

from contracts.binding import Escrow
from market import chain_index, storage
from market.engine import Side
from market.errors import ChainUnavailableError, QuotaError, UnfundedError
from market.models import Deal, Order, Provider
from market.verify import CheckedOrder


class _Cache:
    """Escrow figures by address, each kept `ttl` seconds."""

    def __init__(self, read: Callable[[str], int], ttl: float) -> None:
        self._read = read
        self._ttl = ttl
        self._values: dict[str, tuple[int, float]] = {}
        self._lock = threading.Lock()

    def get(self, address: str) -> tuple[int, bool]:
        """Return the figure of `address` and whether it was read now: the cached one if
        younger than the cache allows, else read from the escrow."""
        with self._lock:
            cached = self._values.get(address)
        if cached is not None and time.monotonic() - cached[1] <= self._ttl:
            return cached[0], False
        return self.read(address), True

    def cached(self, address: str) -> int | None:
        """Return the last figure read for `address`, however old, or None."""
        with self._lock:
            cached = self._values.get(address)
        return None if cached is None else cached[0]

    def at_least(self, address: str, need: int) -> int:
        """Return the figure of `address`, read afresh if the cached one is below `need`."""
        value, read = self.get(address)
        return value if read or value >= need else self.read(address)

    def read(self, address: str) -> int:
        """Read the figure of `address` from the escrow and cache it."""
        value = self._read(address)
        with self._lock:
            self._values[address] = (value, time.monotonic())
            if len(self._values) > 100_000:
                self._values.clear()
        return value


HOLDERS_PER_QUERY = 500
"""Accounts looked up per SQL query by `FundsGuard.reread` (bound parameters per statement)."""


class Reread(NamedTuple):
    """What `FundsGuard.reread` did."""

    reads: int  # chain reads made
    changed: bool  # a figure differs from the one cached before
    raised: bool  # a bidder's balance rose (or was never read): bids held back may trade now
    done: bool  # every figure was read (False: the chain went down midway)


class Reservation:
    """What one request's orders hold of their signers' funds until they are committed."""

    def __init__(self, guard: FundsGuard) -> None:
        """Hold nothing yet."""
        self._guard = guard
        self.held: dict[str, tuple[int, int]] = {}  # owner -> (spend, orders)

    def release(self) -> None:
        """Give the held funds back (the committed orders now count from the database)."""
        held, self.held = self.held, {}
        self._guard._release(held)


class FundsGuard:
    """Admit orders and heartbeats that have escrow funds behind them (see the module)."""

    def __init__(
        self,
        *,
        read_escrow: Callable[[Callable[[Escrow], Any]], Any],
        session: Callable[[], AbstractContextManager[Session]],
        book_classes: Callable[[], list[str]],
        min_provider_stake: int,
        max_live_orders: int,
        max_classes_per_provider: int,
        unopened_deal_hold_s: int,
        cache_s: float,
        provider_ttl_s: float = 60.0,
    ) -> None:
        """Read the escrow with `read_escrow`, the market's records with `session`."""
        self._session = session
        self._book_classes = book_classes
        self.min_provider_stake = min_provider_stake
        self.max_live_orders = max_live_orders
        self.max_classes_per_provider = max_classes_per_provider
        self.unopened_deal_hold_s = unopened_deal_hold_s
        self.provider_ttl_s = provider_ttl_s
        self.balances = _Cache(lambda a: int(read_escrow(lambda e: e.balance_of(a))), cache_s)
        self.stakes = _Cache(lambda a: int(read_escrow(lambda e: e.stake_of(a))), cache_s)
        self._lock = threading.Lock()
        self._reserved: dict[str, tuple[int, int]] = {}  # owner -> (spend, orders) in flight

    # -- orders ---------------------------------------------------------------------------------

    def reserve(self, orders: Sequence[CheckedOrder], now: int) -> Reservation:
        """Check `orders` (one request, verified) against their signers' funds and hold what
        they commit; release the reservation once they are committed (or failed). Raise
        `UnfundedError` or `QuotaError` if they are not covered."""
        by_owner: dict[str, list[CheckedOrder]] = {}
        for checked in orders:
            by_owner.setdefault(checked.order.owner, []).append(checked)
        known = self._known_classes()
        for owner, mine in sorted(by_owner.items()):
            self._check_asks(owner, [c for c in mine if c.order.side is Side.ASK], now, known)
        for checked in orders:
            name = checked.order.device_class
            if checked.order.side is Side.BID and name not in known:
                raise UnfundedError(
                    f"device class {name!r} is advertised by no staked provider: no bid can "
                    "match in it"
                )
        reservation = Reservation(self)
        try:
            for owner, mine in sorted(by_owner.items()):
                reservation.held[owner] = self._reserve(owner, mine, now)
        except BaseException:
            reservation.release()
            raise
        return reservation

    def _release(self, held: dict[str, tuple[int, int]]) -> None:
        with self._lock:
            for owner, (spend, count) in held.items():
                left_spend, left_count = self._reserved[owner]
                if left_count == count:
                    del self._reserved[owner]
                else:
                    self._reserved[owner] = (left_spend - spend, left_count - count)

    def _known_classes(self) -> set[str]:
        with self._session() as session:
            advertised = storage.advertised_classes(session=session)
        return set(self._book_classes()) | set(advertised)

    def _check_asks(self, owner: str, asks: list[CheckedOrder], now: int, known: set[str]) -> None:
        """Refuse asks whose signer lacks the stake they promise, or would hold too many
        device classes; add their classes to `known`."""
        if not asks:
            return
        need = max([self.min_provider_stake, *(_quote_stake(c) for c in asks)])
        stake = self.stakes.at_least(owner, need)
        if stake < need:
            raise UnfundedError(
                f"ask signer {owner} has {stake} free stake on the escrow; its asks need "
                f"{need} (the market's minimum {self.min_provider_stake} and each quote's stake)"
            )
        with self._session() as session:
            classes = set(storage.live_ask_classes(session=session, owner=owner, now=now))
        classes.update(c.order.device_class for c in asks)
        if len(classes) > self.max_classes_per_provider:
            raise QuotaError(
                f"{owner} would ask in {len(classes)} device classes; at most "
                f"{self.max_classes_per_provider}"
            )
        known.update(classes)

    def _reserve(self, owner: str, orders: list[CheckedOrder], now: int) -> tuple[int, int]:
        """Check one signer's orders of a request against its funds; reserve and return their
        (spend, count). A shortfall on a cached balance is decided again on a fresh read."""
        spend = sum(c.order.price * c.order.quantity for c in orders if c.order.side is Side.BID)
        balance, read = self.balances.get(owner) if spend else (0, True)
        for again in (False, True):
            if again:
                if read:
                    break
                balance = self.balances.read(owner)  # not under the lock: a chain read
            with self._lock:  # held across the check and the reservation: no double spend
                with self._session() as session:
                    live, committed = storage.commitments(
                        session=session,
                        owner=owner,
                        now=now,
                        deals_since=now - self.unopened_deal_hold_s,
                    )
                flying_spend, flying_count = self._reserved.get(owner, (0, 0))
                count = live + flying_count + len(orders)
                if count > self.max_live_orders:
                    raise QuotaError(
                        f"{owner} would hold {count} live orders; at most {self.max_live_orders}"
                    )
                needed = committed + flying_spend + spend
                if needed <= balance or not spend:
                    self._reserved[owner] = (flying_spend + spend, flying_count + len(orders))
                    return spend, len(orders)
        raise UnfundedError(
            f"bids of {owner} need {spend} on top of {needed - spend} committed (live bids, "
            f"unopened deals); its free escrow balance is {balance}"
        )

    # -- providers ------------------------------------------------------------------------------

    def check_provider(self, provider: str) -> None:
        """Raise `UnfundedError` unless `provider`'s stake on the escrow, free or locked in its
        open deals, reaches the market's minimum."""
        with self._session() as session:
            locked = chain_index.open_deal_stakes(session=session, provider=provider)
        stake = self.stakes.at_least(provider, self.min_provider_stake - locked) + locked
        if stake < self.min_provider_stake:
            raise UnfundedError(
                f"provider {provider} has {stake} staked on the escrow (free and in open "
                f"deals); the market registers providers from {self.min_provider_stake}"
            )

    # -- figures moved on chain -----------------------------------------------------------------

    def reread(self, accounts: Collection[str], now: int) -> Reread:
        """Read again the figures of `accounts` (those indexed escrow events moved) that matter
        to the market at `now`: the free balance of each owner of live bids, the free stake of
        each owner of live asks and of each registered provider. Nothing else is read: at most
        one read per such account and figure, however many events moved it."""
        bidders, stakers = self._holders(accounts, now)
        reads, changed, raised = 0, False, False
        try:
            for owner in sorted(bidders):
                before = self.balances.cached(owner)
                after = self.balances.read(owner)
                reads += 1
                changed |= after != before
                raised |= before is None or after > before
            for owner in sorted(stakers):
                before = self.stakes.cached(owner)
                after = self.stakes.read(owner)
                reads += 1
                changed |= after != before
        except ChainUnavailableError:
            return Reread(reads, changed, raised, done=False)
        return Reread(reads, changed, raised, done=True)

    def _holders(self, accounts: Collection[str], now: int) -> tuple[set[str], set[str]]:
        """Return which of `accounts` own live bids, and which own live asks or are
        registered providers."""
        listed = sorted(accounts)
        bidders: set[str] = set()
        stakers: set[str] = set()
        with self._session() as session:
            for start in range(0, len(listed), HOLDERS_PER_QUERY):
                chunk = listed[start : start + HOLDERS_PER_QUERY]
                live = session.exec(
                    select(Order.owner, Order.side)
                    .where(
                        col(Order.owner).in_(chunk),
                        col(Order.state).in_(storage.LIVE_STATES),
                        Order.expiry > now,
                    )
                    .distinct()
                ).all()
                for owner, side in live:
                    (bidders if side == Side.BID.value else stakers).add(owner)
                stakers.update(
                    session.exec(select(Provider.address).where(col(Provider.address).in_(chunk)))
                )
        return bidders, stakers

    # -- matching -------------------------------------------------------------------------------

    def gate(self, now: int) -> MatchGate:
        """Return the engine's gate for one group of orders matched at `now`."""
        return MatchGate(self, now)

    def balance_now(self, owner: str) -> int:
        """Return `owner`'s free escrow balance read now (a withdrawal a second ago counts);
        if the chain cannot be read, the last figure read, or 0: nothing fills on a guess."""
        try:
            return self.balances.read(owner)
        except ChainUnavailableError:
            cached = self.balances.cached(owner)
            return 0 if cached is None else cached

    def provider_live(self, provider: str, now: int) -> bool:
        """Return whether `provider` heartbeated within `provider_ttl_s` of `now`."""
        with self._session() as session:
            seen = session.exec(
                select(Provider.last_seen).where(Provider.address == provider)
            ).first()
        return seen is not None and seen >= now - self.provider_ttl_s

    def unopened_spend(self, client: str, now: int) -> int:
        """Return the spend of `client`'s deals matched within `unopened_deal_hold_s` of `now`
        and not open on chain."""
        with self._session() as session:
            deals = session.exec(
                select(Deal.price, Deal.quantity).where(
                    Deal.client == client,
                    col(Deal.chain_deal_id).is_(None),
                    Deal.created_at >= now - self.unopened_deal_hold_s,
                )
            ).all()
        return sum(int(price) * int(quantity) for price, quantity in deals)


class MatchGate:
    """What may trade in one group commit (see the module): budgets and liveness, each read
    once per owner and kept for the group, whose fills are not in the database yet."""

    def __init__(self, guard: FundsGuard, now: int) -> None:
        """Answer for orders matched at `now`."""
        self._guard = guard
        self._now = now
        self._budgets: dict[str, int] = {}
        self._live: dict[str, bool] = {}

    def ask_live(self, owner: str) -> bool:
        """Return whether `owner`'s provider heartbeated within its TTL."""
        live = self._live.get(owner)
        if live is None:
            live = self._live[owner] = self._guard.provider_live(owner, self._now)
        return live

    def bid_units(self, owner: str, price: int, units: int) -> int:
        """Return how many of `units` at `price` `owner`'s free escrow balance still covers
        (after its unopened deals and this group's fills), and count them as spent."""
        budget = self._budgets.get(owner)
        if budget is None:
            budget = self._guard.balance_now(owner) - self._guard.unopened_spend(owner, self._now)
        take = max(0, min(units, budget // price))
        self._budgets[owner] = budget - take * price
        return take


def _quote_stake(checked: CheckedOrder) -> int:
    quote: dict[str, Any] = json.loads(checked.quote_json or "{}")
    return int(quote.get("stake", 0))
