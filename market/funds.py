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
  `max_live_orders_per_owner` live orders per signer; a signer that bids holds at most one
  live order per `min_balance_per_order` of its free escrow balance (a barely funded key
  cannot fill the book with thousands of orders; the book shows its bids by the same rule,
  `market.bidders`).

Every figure the check needs is in memory (processes sharing a database read the others'
classes from SQL, `market.partition`), so admitting an order costs a few dictionary reads and
no SQL, under a lock held for microseconds: what each signer committed (live orders, its
live bids' unfilled spend, its live asks' classes, its unopened deals' spend) is kept by
`market.commitments.Commitments`, changed by the writer as it commits and loaded from SQL at
start; the classes providers advertise and their last heartbeats are kept as heartbeats come.
Free balances are kept until an escrow event moves them: after each indexer run,
`FundsGuard.reread` reads again the figures of the accounts whose balance or stake the run's
events moved, if they hold something on the market (live bids: the balance; live asks or a
registration: the stake), at most one read per account and figure whatever the events; the
kept balance of a moved account holding nothing is dropped (read again if it bids), and its
deals that opened on chain stop counting. A backstop pass reads each live bidder's balance
again in turn (`PayingBidders.refresh`) for anything the events miss. Stakes are kept the same
way (Staked, Unstaked, a deal opened, paid out or refunded). A process that does not index
(`market.partition`) keeps both for `funds_cache_s`. Each figure is one `eth_call`
(`market.chain_rpc`). A refusal is decided on a figure read for it (a client that just deposited is
never refused on a stale one; a flood of unfunded orders costs one read each, within the
signer's and the IP's rate limits); an account never read is read once (off the event loop).
What a request reserves is held in memory until its orders are committed (then the
commitments count them), so two requests of one signer racing cannot both spend one balance.
Refusals are `UnfundedError` or `QuotaError` (403), with the figures that decided them.

Admission is not enough: a wallet can withdraw after its bid rests, and a provider's daemon can
stop after its ask rests. So the writer also matches each group through a `MatchGate`
(`market.match_gate`; the engine's `market.engine.gate.Gate`): a bid fills only as far as its
owner's free escrow balance covers the spend of its matched deals not yet open plus this fill
(its resting bids are not counted again: they are what is filling), and an ask trades only while
its provider's last heartbeat is younger than `provider_ttl_s`. What cannot trade rests: an
empty wallet's bid never fills, and a silent provider's ask matches again once it heartbeats. A
match's spend stops counting when its deal opens on chain (the escrow locks it) or
`unopened_deal_hold_s` after the match (it expired unopened). The gate reads no SQL; for a bid's
owner it takes the balance kept in memory when the chain head (one `eth_blockNumber`, read at
most once per `head_max_age_s`, not once per group) is the block the indexer last confirmed
every kept balance at (`FundsGuard.confirm`): no block since, so no withdrawal unseen but one
mined within `head_max_age_s` (50 ms by default), which gives a client nothing it lacks: a match
locks no funds until its deal opens on chain, so a client can withdraw just after any match.
Otherwise (a block since, or no indexer) it takes the balance it read itself at this same head,
else reads it afresh: one read per owner and block.
"""

from __future__ import annotations

import json
import math
import threading
import time
from collections.abc import Callable, Collection, Sequence
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, NamedTuple

from sqlmodel import Session, col, select

from market import chain_index, storage
from market.commitments import Commitments, Figures
from market.engine import Side
from market.errors import ChainUnavailableError, QuotaError, UnfundedError
from market.figure_cache import FigureCache
from market.match_gate import MatchGate
from market.models import Deal, Provider
from market.verify import CheckedOrder

if TYPE_CHECKING:
    from market.partition import FundsHold, SharedFunds

HOLDERS_PER_QUERY = 500
"""Accounts looked up per SQL query by `FundsGuard.reread` (bound parameters per statement)."""


class Reread(NamedTuple):
    """What `FundsGuard.reread` did."""

    reads: int  # chain reads made
    changed: bool  # a figure differs from the one cached before
    raised: bool  # a bidder's balance rose (or was never read): bids held back may trade now
    done: bool  # every figure was read (False: the chain went down midway)


class ReadNeeded(Exception):
    """Raise when a check cannot be decided on the figures in memory (`reserve(read=False)`)."""


class Reservation:
    """What one request's orders hold of their signers' funds until they are committed."""

    def __init__(self, guard: FundsGuard) -> None:
        """Hold nothing yet."""
        self._guard = guard
        self.held: dict[str, tuple[int, int]] = {}  # owner -> (spend, orders)
        self.hold: FundsHold | None = None  # the signers' locks across processes, if shared

    def release(self) -> None:
        """Give the held funds back (the committed orders now count in `Commitments`, and in
        SQL for the other processes)."""
        held, self.held = self.held, {}
        self._guard._release(held)
        hold, self.hold = self.hold, None
        if hold is not None:
            hold.release()


class FundsGuard:
    """Admit orders and heartbeats that have escrow funds behind them (see the module)."""

    def __init__(
        self,
        *,
        read_balance: Callable[[str], int],
        read_stake: Callable[[str], int],
        session: Callable[[], AbstractContextManager[Session]],
        book_classes: Callable[[], list[str]],
        commitments: Commitments,
        min_provider_stake: int,
        max_live_orders: int,
        max_classes_per_provider: int,
        min_balance_per_order: int = 0,
        cache_s: float,
        provider_ttl_s: float = 60.0,
        head: Callable[[], int] | None = None,
        head_max_age_s: float = 0.0,
        monotonic: Callable[[], float] = time.monotonic,
        shared: SharedFunds | None = None,
        balance_cache_s: float = math.inf,
    ) -> None:
        """Read free balances and stakes with `read_balance` and `read_stake` (the chain head
        with `head`, reused for `head_max_age_s` of `monotonic`), the market's records with
        `session`; count commitments in `commitments`, and with `shared` those
        of other processes' classes too (`market.partition`); keep a balance read for
        `balance_cache_s` (forever: until an indexed event moves it, `reread`)."""
        self._session = session
        self._book_classes = book_classes
        self.commitments = commitments
        self.min_provider_stake = min_provider_stake
        self.max_live_orders = max_live_orders
        self.min_balance_per_order = min_balance_per_order
        self.max_classes_per_provider = max_classes_per_provider
        self.unopened_deal_hold_s = commitments.hold_s
        self.provider_ttl_s = provider_ttl_s
        self._head = head
        self.head_max_age_s = head_max_age_s
        self._monotonic = monotonic
        self._kept_head: tuple[int, float] | None = None  # (head, when its read began)
        self.shared = shared
        # Balances are kept until an event moves them (`reread`), not for a time.
        self.balances = FigureCache(read_balance, balance_cache_s)
        self.stakes = FigureCache(read_stake, cache_s)
        self._lock = threading.Lock()
        self._reserved: dict[str, tuple[int, int]] = {}  # owner -> (spend, orders) in flight
        self._advertised: set[str] | None = None  # classes registered providers advertise
        self._seen: dict[str, float] = {}  # provider -> its last heartbeat (market clock)
        self.confirmed_block: int | None = None  # balances in memory are exact at this head
        self._read_at: dict[str, int] = {}  # owner -> the head when the gate read its balance
        self._returned = 0  # heartbeats of providers that were silent (or new)

    # -- orders ---------------------------------------------------------------------------------

    def reserve(
        self, orders: Sequence[CheckedOrder], now: int, *, read: bool = True
    ) -> Reservation:
        """Check `orders` (one request, verified) against their signers' funds and hold what
        they commit; release the reservation once they are committed (or failed). Raise
        `UnfundedError` or `QuotaError` if they are not covered; with `read` False, raise
        `ReadNeeded` instead of reading the escrow (the caller retries off the event loop).
        With `shared`, the signers stay locked across processes until the reservation is
        released, and their commitments in other processes' classes are read from SQL."""
        if self.shared is not None and not read:
            raise ReadNeeded("the funds of several processes are read from SQL")
        by_owner: dict[str, list[CheckedOrder]] = {}
        for checked in orders:
            by_owner.setdefault(checked.order.owner, []).append(checked)
        known = self._known_classes()
        for owner, mine in sorted(by_owner.items()):
            asks = [c for c in mine if c.order.side is Side.ASK]
            if asks:
                self._check_asks(owner, asks, now, known, read)
        for checked in orders:
            name = checked.order.device_class
            if checked.order.side is Side.BID and name not in known:
                raise UnfundedError(
                    f"device class {name!r} is advertised by no staked provider: no bid can "
                    "match in it"
                )
        reservation = Reservation(self)
        try:
            if self.shared is not None:
                reservation.hold = self.shared.hold(list(by_owner))
            for owner, mine in sorted(by_owner.items()):
                reservation.held[owner] = self._reserve(owner, mine, now, read, reservation.hold)
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

    def advertised(self, device_class: str) -> None:
        """Count `device_class` as advertised by a registered provider (a heartbeat)."""
        if self._advertised is not None:
            self._advertised.add(device_class)

    def _known_classes(self) -> set[str]:
        if self._advertised is None:
            with self._session() as session:
                self._advertised = set(storage.advertised_classes(session=session))
        return set(self._book_classes()) | self._advertised

    def _check_asks(
        self, owner: str, asks: list[CheckedOrder], now: int, known: set[str], read: bool
    ) -> None:
        """Refuse asks whose signer lacks the stake they promise, or would hold too many
        device classes; add their classes to `known`."""
        need = max([self.min_provider_stake, *(_quote_stake(c) for c in asks)])
        if not read:
            cached = self.stakes.fresh(owner)
            if cached is None or cached < need:
                raise ReadNeeded(owner)
        stake = self.stakes.at_least(owner, need)
        if stake < need:
            raise UnfundedError(
                f"ask signer {owner} has {stake} free stake on the escrow; its asks need "
                f"{need} (the market's minimum {self.min_provider_stake} and each quote's stake)"
            )
        classes = set(self.commitments.figures(owner, now).ask_classes)
        classes.update(c.order.device_class for c in asks)
        if len(classes) > self.max_classes_per_provider:
            raise QuotaError(
                f"{owner} would ask in {len(classes)} device classes; at most "
                f"{self.max_classes_per_provider}"
            )
        known.update(classes)

    def _reserve(
        self,
        owner: str,
        orders: list[CheckedOrder],
        now: int,
        read: bool,
        hold: FundsHold | None = None,
    ) -> tuple[int, int]:
        """Check one signer's orders of a request against its funds; reserve and return their
        (spend, count). A shortfall on a kept balance is decided again on a fresh read."""
        spend = sum(c.order.price * c.order.quantity for c in orders if c.order.side is Side.BID)
        balance, fresh = 0, True
        if spend:
            cached = self.balances.fresh(owner)
            if cached is None and not read:
                raise ReadNeeded(owner)
            balance, fresh = (
                (self.balances.read(owner), True) if cached is None else (cached, False)
            )
        for again in (False, True):
            if again:
                if fresh:
                    break
                if not read:
                    raise ReadNeeded(owner)
                balance, fresh = self.balances.read(owner), True  # not under the lock
            figures = self._figures(owner, now, hold)
            with self._lock:  # held across the check and the reservation: no double spend
                flying_spend, flying_count = self._reserved.get(owner, (0, 0))
                count = figures.live + figures.cancelled + flying_count + len(orders)
                if count > self.max_live_orders:
                    raise QuotaError(
                        f"{owner} would hold {count} live orders (cancelled ones count until "
                        f"their expiry); at most {self.max_live_orders}"
                    )
                needed = figures.bid_spend + figures.deal_spend + flying_spend + spend
                per_order = self.min_balance_per_order
                short = needed > balance or count * per_order > balance
                if short and spend and fresh and needed <= balance:
                    raise QuotaError(
                        f"{owner} would hold {count} live orders; its free escrow balance "
                        f"{balance} covers {balance // per_order} at {per_order} each"
                    )
                if not short or not spend:
                    self._reserved[owner] = (flying_spend + spend, flying_count + len(orders))
                    return spend, len(orders)
        raise UnfundedError(
            f"bids of {owner} need {spend} on top of {needed - spend} committed (live bids, "
            f"unopened deals); its free escrow balance is {balance}"
        )

    def _figures(self, owner: str, now: int, hold: FundsHold | None) -> Figures:
        """Return `owner`'s commitments in this process, plus, with `hold`, in the others'."""
        figures = self.commitments.figures(owner, now)
        if hold is None:
            return figures
        other = hold.others(owner, now, self.unopened_deal_hold_s)
        return figures._replace(
            live=figures.live + other.live,
            bid_spend=figures.bid_spend + other.bid_spend,
            deal_spend=figures.deal_spend + other.deal_spend,
            cancelled=figures.cancelled + other.cancelled,
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

    def seen(self, provider: str, at: float, device_class: str) -> None:
        """Record a provider's heartbeat at `at` advertising `device_class`."""
        before = self._seen.get(provider)
        if before is None or before < at - self.provider_ttl_s:
            self._returned += 1  # back (or new): its asks the gate held back may trade
        self._seen[provider] = at
        self.advertised(device_class)

    def changes(self) -> int:
        """Return a count that grows whenever what the gate lets trade may have grown: a
        balance read higher, a deal that stopped counting, a provider back. While it stays,
        matching the resting orders again finds nothing new."""
        return self.balances.raises + self.commitments.released + self._returned

    # -- figures moved on chain -----------------------------------------------------------------

    def reread(self, accounts: Collection[str], now: int) -> Reread:
        """Read again the figures of `accounts` (those indexed escrow events moved) that matter
        to the market at `now`: the free balance of each owner of live bids, the free stake of
        each owner of live asks and of each registered provider. Nothing else is read: at most
        one read per such account and figure, however many events moved it. The others' kept
        balances are dropped (read again if they bid), and their deals now open stop counting."""
        bidders, stakers = self._holders(accounts)
        opened = self._opened(accounts)
        if opened:
            self.commitments.opened(opened)
        for account in accounts:
            if account not in bidders:
                self.balances.forget(account)
        reads, changed, raised = 0, bool(opened), False
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
        return Reread(reads, changed, raised | bool(opened), done=True)

    def confirm(self, block: int | None) -> None:
        """Record that every balance kept in memory is exact at chain head `block` (the
        indexer read every event up to it and `reread` what they moved); None: not known."""
        self.confirmed_block = block

    def _holders(self, accounts: Collection[str]) -> tuple[set[str], set[str]]:
        """Return which of `accounts` own live bids, and which own live asks or are
        registered providers."""
        bidders, stakers = self.commitments.holders(accounts)
        listed = sorted(accounts)
        with self._session() as session:
            for start in range(0, len(listed), HOLDERS_PER_QUERY):
                chunk = listed[start : start + HOLDERS_PER_QUERY]
                stakers.update(
                    session.exec(select(Provider.address).where(col(Provider.address).in_(chunk)))
                )
        return bidders, stakers

    def _opened(self, accounts: Collection[str]) -> list[str]:
        """Return the ids of counted deals of `accounts` now open on chain (indexed)."""
        counted = self.commitments.unopened_deals(accounts)
        opened: list[str] = []
        with self._session() as session:
            for start in range(0, len(counted), HOLDERS_PER_QUERY):
                chunk = counted[start : start + HOLDERS_PER_QUERY]
                opened.extend(
                    session.exec(
                        select(Deal.deal_id).where(
                            col(Deal.deal_id).in_(chunk), col(Deal.chain_deal_id).is_not(None)
                        )
                    )
                )
        return opened

    # -- matching -------------------------------------------------------------------------------

    def gate(self, now: int) -> MatchGate:
        """Return the engine's gate for one group of orders matched at `now`."""
        return MatchGate(self, now)

    def balance_at(self, owner: str, head: int | None) -> int:
        """Return `owner`'s free escrow balance at chain head `head` (None: unknown): the one
        read while the head was `head` (no block since: no withdrawal unseen), else read now;
        if the chain cannot be read, the last figure read, or 0: nothing fills on a guess."""
        cached = self.balances.cached(owner)
        if head is not None and cached is not None and self._read_at.get(owner) == head:
            return cached
        try:
            balance = self.balances.read(owner)
        except ChainUnavailableError:
            return 0 if cached is None else cached
        if head is not None:
            if len(self._read_at) > 100_000:
                self._read_at.clear()
            self._read_at[owner] = head
        return balance

    def head_now(self) -> int | None:
        """Return the chain head: the one a read begun less than `head_max_age_s` ago
        returned, else one read now; None without a chain or if it cannot be read."""
        if self._head is None:
            return None
        asked = self._monotonic()
        kept = self._kept_head
        if kept is not None and asked - kept[1] < self.head_max_age_s:
            return kept[0]
        try:
            head = self._head()
        except ChainUnavailableError:
            return None
        self._kept_head = (head, asked)
        return head

    def provider_live(self, provider: str, now: int) -> bool:
        """Return whether `provider` heartbeated within `provider_ttl_s` of `now`."""
        seen = self._seen.get(provider)
        if seen is None:
            with self._session() as session:
                stored = session.exec(
                    select(Provider.last_seen).where(Provider.address == provider)
                ).first()
            if stored is None:
                return False
            seen = self._seen.setdefault(provider, stored)
        return seen >= now - self.provider_ttl_s

    def unopened_spend(self, client: str, now: int) -> int:
        """Return the spend of `client`'s deals matched within `unopened_deal_hold_s` of `now`
        and not open on chain (in every process's classes, with `shared`)."""
        spend = self.commitments.unopened_spend(client, now)
        if self.shared is not None:
            spend += self.shared.unopened_spend(client, now, self.unopened_deal_hold_s)
        return spend


def _quote_stake(checked: CheckedOrder) -> int:
    quote: dict[str, Any] = json.loads(checked.quote_json or "{}")
    return int(quote.get("stake", 0))
