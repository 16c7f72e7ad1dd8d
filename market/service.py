"""The market service: signed orders in, matches and deal records out, all persisted.

Each device class has its own `MatchingEngine`, restored at start from the stored orders and
fills (`market.books`). Requests verify signatures in their own threads (`market.verify`); one
writer thread changes the engines and commits, several requests per transaction
(`market.writer`). A write is answered only after its SQL transaction committed; if the commit
fails, the classes it touched are rebuilt from storage, so the engines never hold an order the
database does not.
"""

from __future__ import annotations

import asyncio
import json
import math
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from prometheus_client import CollectorRegistry
from sqlmodel import Session

from contracts.messages import Domain, Plan, Quote
from contracts.orders import CancelOrder, Heartbeat, advert_hash, market_domain
from contracts.orders import digest as fast_digest
from market import book_writes, chain_index, database, storage
from market.auth import RateLimiter
from market.bidders import BIDDERS_PER_PASS, PayingBidders
from market.books import Books
from market.checkpoint import Checkpointer
from market.commitments import Commitments
from market.errors import (
    AuthError,
    DuplicateOrderError,
    ForbiddenError,
    MarketError,
    NotFoundError,
    PayloadTooLargeError,
    ReplayError,
    SignatureExpiredError,
)
from market.escrow_reader import EscrowReader
from market.funds import FundsGuard, ReadNeeded, Reservation
from market.metrics import Metrics
from market.models import (
    CancelCreate,
    DealPublic,
    HeartbeatCreate,
    OrderCreate,
    OrderPublic,
    PlaceResult,
    PlaceSummary,
    Provider,
    ProviderPublic,
    QuoteAttach,
    QuoteIn,
)
from market.partition import Partition, classes_of, lock_fill_seq
from market.placement import Placed, Rows
from market.presenters import order_public, place_results, place_summaries, provider_public
from market.reads import MarketReads
from market.settings import Settings
from market.verify import CheckedOrder, Verifier, check_deal_quote, checksum, recover
from market.writer import Writer

INLINE_VERIFY_ORDERS = 32
"""Requests with more orders are verified in a worker thread, off the event loop (32 orders
verify in ~5 ms; a 500-order batch would hold the loop ~75 ms)."""


class MarketService(MarketReads):
    """Everything the API does, without HTTP: verify, match, persist, query."""

    def __init__(
        self,
        settings: Settings,
        *,
        clock: Callable[[], float] = time.time,
        registry: CollectorRegistry | None = None,
        escrow: EscrowReader | None = None,
    ) -> None:
        """Connect to the database (creating tables), restore every book, start the writer;
        read the escrow through `escrow` (default: a reader of the settings' escrow)."""
        self.settings = settings
        self.clock = clock
        self.registry = registry or CollectorRegistry()
        self.metrics = Metrics(self.registry)
        self.escrow = escrow or EscrowReader(settings)
        self.domain: Domain = market_domain(settings.chain_id, settings.escrow)
        self.escrow_domain = Domain(chain_id=settings.chain_id, verifying_contract=settings.escrow)
        self.verifier = Verifier(
            self.domain,
            self.escrow_domain,
            settings.max_order_ttl_s,
            min_challenge_window=self.escrow.min_challenge_window,
        )
        self._attach_lock = threading.Lock()
        self._rematched_at = -1  # `FundsGuard.changes()` at the last rematch
        self.db = database.make_engine(
            url=database.database_url(data_dir=settings.data_dir, url=settings.database_url)
        )
        database.init_db(engine=self.db)
        self.partition = Partition(classes_of(settings))  # the classes it writes, claimed
        if self.partition.shared:  # `market serve` claims the database for an all-classes one
            self.partition.claim(self.db)
        with self.db.connect() as connection:  # what each signer committed (`market.funds`)
            self.commitments = Commitments.load(
                connection, self.now(), settings.unopened_deal_hold_s, self.partition.classes
            )
        # Figures are kept until an indexed event moves them where this process indexes.
        kept_s = math.inf if self.partition.indexes else settings.funds_cache_s
        self.funds = FundsGuard(
            read_balance=self.escrow.balance_of,
            read_stake=self.escrow.stake_of,
            session=self.session,
            book_classes=lambda: self.books.names(),
            commitments=self.commitments,
            min_provider_stake=settings.min_provider_stake,
            max_live_orders=settings.max_live_orders_per_owner,
            max_classes_per_provider=settings.max_classes_per_provider,
            min_balance_per_order=settings.min_balance_per_order,
            cache_s=kept_s,
            provider_ttl_s=settings.provider_offline_after_s,
            head=self.escrow.head if self.escrow.known() else None,
            head_max_age_s=settings.head_max_age_s,
            shared=self.partition.funds,
            balance_cache_s=kept_s,
        )
        self.bidders = PayingBidders(
            self.funds, session=self.session, now=self.now, changed=self.changed
        )
        self.address_limiter = RateLimiter(
            rate=settings.rate_per_address, burst=settings.burst_per_address
        )
        self.ip_limiter = RateLimiter(rate=settings.rate_per_ip, burst=settings.burst_per_ip)
        self._version = 0
        self._version_lock = threading.Lock()
        self.books = Books(self.db, self.now, self.partition.owns)
        for name, book in self.books.items():
            self.metrics.set_live(name, book.engine)
        guards = self.guards_funds()
        gate = self.funds.gate if guards else None  # what may trade (market.funds)
        self.writer = Writer(
            books=self.books,
            db=self.db,
            on_commit=self._committed,
            gate=gate,
            on_rows=self._count_rows if guards else None,
            lock_seq=lock_fill_seq if self.partition.shared else None,
            sole_writer=not self.partition.shared,
        )
        self.checkpointer = (
            Checkpointer(self.db, lambda: self._version, on_checkpoint=self.writer.checkpoint_soon)
            if self.db.dialect.name == "sqlite"
            else None
        )

    # -- plumbing -------------------------------------------------------------------------------

    def close(self) -> None:
        """Finish queued writes, stop the writer and release the database connections."""
        self.writer.close()
        if self.checkpointer is not None:
            self.checkpointer.close()
        self.partition.release()
        self.db.dispose()

    @property
    def version(self) -> int:
        """Return a counter that grows with every change (the live page polls it)."""
        return self._version

    def changed(self) -> None:
        """Count a change: `version` grows (the live page polls it)."""
        with self._version_lock:
            self._version += 1

    # -- orders ---------------------------------------------------------------------------------

    def attach_quote(self, deal_id: str, attach: QuoteAttach) -> DealPublic:
        """Give a matched deal its own quote: the one that opens it on chain.

        An ask's quote names no client, so it only states the terms; after a match the provider
        signs a quote for the deal. It is accepted only if signed by the deal's provider under
        the escrow domain, naming the deal's client, with the ask's terms (plan, SLO, stake,
        penalty, challenge window, arbiter, duration), a cap covering the deal's spend, still
        valid, and if the deal has no quote yet or its quote expired unused. The same quote
        attached again is answered as before. Anyone may post (the signature authenticates), so
        a quote attached to another deal or whose nonce the escrow saw used is refused too.
        """
        with self._attach_lock, self.session() as session:
            deal = storage.get_deal(session=session, deal_id=deal_id)
            if deal is None:
                raise NotFoundError(f"no deal {deal_id!r}")
            ask = storage.get_order(session=session, order_id=deal.ask_id)
            assert ask is not None and ask.quote_json is not None
            q = attach.quote
            if q.provider.lower() != deal.provider.lower():
                raise ForbiddenError(f"deal {deal_id} belongs to provider {deal.provider}")
            plan = Plan(**q.plan.model_dump())
            struct = self.verifier.quote(q, plan, attach.quote_signature, deal.provider)
            quote_hash = "0x" + struct.hex()
            if deal.quote_json is not None and deal.quote_hash == quote_hash:
                return self.deal_publics(session, [deal])[0]  # attached before: idempotent
            if deal.chain_deal_id is not None:
                raise ReplayError(f"deal {deal_id} is already open on chain")
            check_deal_quote(q, plan, deal, Quote.from_json(json.loads(ask.quote_json)))
            now = self.now()
            if q.valid_until <= now:
                raise SignatureExpiredError(f"quote expired at {q.valid_until} (now {now})")
            if deal.quote_json is not None:
                held = QuoteIn.model_validate_json(deal.quote_json)
                # A held quote gives way once it is past by the market's clock or by block
                # time (the escrow's; read only on this rare path, a quote replacing another):
                # a chain ahead of the host's clock has already made it useless.
                if held.valid_until > now and (
                    not self.escrow.known() or held.valid_until >= self.escrow.chain_time()
                ):
                    raise ReplayError(
                        f"deal {deal_id} has a quote valid until {held.valid_until}: one quote "
                        "per deal (another is accepted once it expired unused)"
                    )
                self.escrow.refuse_used_nonce(held.provider, held.nonce, "its expired quote")
            other = storage.quote_attached_elsewhere(
                session=session, quote_hash=quote_hash, deal_id=deal_id
            )
            if other is not None:
                raise ReplayError(f"this quote belongs to deal {other}")
            self.escrow.refuse_used_nonce(q.provider, q.nonce, "this quote")
            deal.quote_hash = quote_hash
            deal.quote_json = q.model_dump_json()
            deal.quote_signature = attach.quote_signature.lower()
            session.add(deal)
            session.commit()
            public = self.deal_publics(session, [deal])[0]
        self.changed()
        return public

    def _reserve(
        self, checked: Sequence[CheckedOrder], now: int, *, read: bool = True
    ) -> Reservation | None:
        """Check verified orders' funds (`market.funds`) and hold them; None when funds are not
        required. With `read` False, raise `ReadNeeded` rather than read the escrow."""
        if not self.guards_funds():
            return None
        try:
            return self.funds.reserve(checked, now, read=read)
        except MarketError as exc:
            self.metrics.rejected.labels(type(exc).__name__).inc()
            raise

    def place(self, orders_in: Sequence[OrderCreate]) -> list[PlaceResult]:
        """Verify, match and persist orders atomically; return each order and its fills."""
        checked, now, started = self._verify(orders_in)
        reservation = self._reserve(checked, now)
        try:
            placed = self.writer.place(checked, now)
        finally:
            if reservation is not None:
                reservation.release()
        return place_results(self._placed(placed, started))

    def place_batch(self, orders_in: Sequence[OrderCreate]) -> list[PlaceSummary]:
        """Like `place`, answering each order's id, state and fills only (cheaper)."""
        checked, now, started = self._verify(orders_in)
        reservation = self._reserve(checked, now)
        try:
            placed = self.writer.place(checked, now)
        finally:
            if reservation is not None:
                reservation.release()
        return place_summaries(self._placed(placed, started))

    async def place_async(self, orders_in: Sequence[OrderCreate]) -> list[PlaceResult]:
        """`place` for an event loop: verify (see `_place_async`), await the commit."""
        placed, started = await self._place_async(orders_in)
        return place_results(self._placed(placed, started))

    async def placed_async(self, orders_in: Sequence[OrderCreate]) -> list[Placed]:
        """`place_async` answering what the writer did (the fast route encodes it itself)."""
        placed, started = await self._place_async(orders_in)
        return self._placed(placed, started)

    async def place_batch_async(self, orders_in: Sequence[OrderCreate]) -> list[PlaceSummary]:
        """`place_batch` for an event loop: verify (see `_place_async`), await the commit."""
        placed, started = await self._place_async(orders_in)
        return place_summaries(self._placed(placed, started))

    async def _place_async(self, orders_in: Sequence[OrderCreate]) -> tuple[list[Placed], float]:
        """Verify orders, check their funds and await their commit without blocking the loop.

        A few orders are verified on the loop (cheaper than a thread hop); more, and the funds
        check (SQL, maybe an escrow read), run in a worker thread, so a 500-order batch never
        stalls other requests.
        """
        if len(orders_in) <= INLINE_VERIFY_ORDERS:
            checked, now, started = self._verify(orders_in)
        else:
            checked, now, started = await asyncio.to_thread(self._verify, orders_in)
        reservation = None
        if self.guards_funds():  # in memory (O(1)) on the loop; a chain read in a thread
            try:
                reservation = self._reserve(checked, now, read=False)
            except ReadNeeded:
                reservation = await asyncio.to_thread(self._reserve, checked, now)
        try:
            placed = await self.writer.submit_async(checked, now)
        finally:
            if reservation is not None and reservation.hold is not None:  # SQL: off the loop
                await asyncio.to_thread(reservation.release)
            elif reservation is not None:
                reservation.release()
        return placed, started

    def _verify(self, orders_in: Sequence[OrderCreate]) -> tuple[list[CheckedOrder], int, float]:
        """Check orders (signatures, expiry, duplicates, rate limits) for the writer; return
        them with the market clock and the start time."""
        if len(orders_in) > self.settings.max_batch:
            raise PayloadTooLargeError(f"at most {self.settings.max_batch} orders per batch")
        self.partition.refuse(o.device_class for o in orders_in)
        started = time.perf_counter()
        now = self.now()
        created = self.clock()
        try:
            checked = self.verifier.orders(orders_in, now, created)
        except MarketError as exc:
            self.metrics.rejected.labels(type(exc).__name__).inc()
            raise
        per_owner: dict[str, int] = {}
        seen_ids: set[str] = set()
        seen_nonces: set[tuple[str, int]] = set()
        for c in checked:
            owner = c.order.owner
            per_owner[owner] = per_owner.get(owner, 0) + 1
            if c.order.order_id in seen_ids:
                raise DuplicateOrderError(c.order.order_id)
            if (owner, c.nonce) in seen_nonces:
                raise ReplayError(f"nonce {c.nonce} of {owner} appears twice in batch")
            seen_ids.add(c.order.order_id)
            seen_nonces.add((owner, c.nonce))
        for owner, count in per_owner.items():
            self.address_limiter.take(owner, count)
        return checked, now, started

    def _placed(self, placed: list[Placed], started: float) -> list[Placed]:
        self.metrics.place_seconds.observe(time.perf_counter() - started)
        return placed

    def _count_rows(self, rows: Rows) -> None:
        """Count a committed write's orders, progress and deals in the commitments (writer)."""
        self.commitments.apply(rows.orders, rows.updates, rows.deals)

    def _progress(self, updates: Iterable[tuple[str, str, int]]) -> None:
        """Count committed cancels and expiries in the commitments, when the funds are checked."""
        if self.guards_funds():
            self.commitments.progress(updates)

    def _committed(self, results: list[list[Placed]]) -> None:
        """Count a committed group's orders and fills (runs in the writer thread)."""
        self.metrics.count_committed(results)
        self.changed()

    def cancel(self, cancel_in: CancelCreate) -> OrderPublic:
        """Cancel an order on its owner's signed request; return the order's final state."""
        now = self.now()
        owner = checksum(cancel_in.owner)
        message = CancelOrder(
            owner=owner,
            order_id=bytes.fromhex(cancel_in.order_id[2:]),
            nonce=cancel_in.nonce,
            expiry=cancel_in.expiry,
        )
        if cancel_in.expiry <= now:
            raise SignatureExpiredError(f"cancel expired at {cancel_in.expiry} (now {now})")
        signer = recover("CancelOrder", fast_digest(message, self.domain), cancel_in.signature)
        if signer != owner.lower():
            raise AuthError(f"cancel signed by {signer}, not by {owner}")
        self.address_limiter.take(owner)
        order_id = cancel_in.order_id.lower()
        row = self.writer.call(
            lambda: book_writes.cancel(
                self.books,
                self.writer,
                self.session,
                order_id,
                owner,
                cancel_in.nonce,
                self._progress,
            )
        )
        self.changed()
        return order_public(row)

    def expire_orders(self) -> int:
        """Expire every live order past its expiry, in every class; return how many."""
        total = self.writer.call(
            lambda: book_writes.expire(
                self.books, self.session, self.now(), self.metrics, self._progress
            )
        )
        if total:
            self.metrics.expired.inc(total)
            self.changed()
        return total

    # -- providers ------------------------------------------------------------------------------

    def heartbeat(self, hb: HeartbeatCreate, raw_advert: dict[str, Any]) -> ProviderPublic:
        """Record a provider's signed advert; return its registry entry."""
        now = self.clock()
        self.partition.refuse([hb.advert.device_class])
        provider = checksum(hb.provider)
        if abs(hb.timestamp - now) > self.settings.heartbeat_skew_s:
            raise SignatureExpiredError(
                f"heartbeat timestamp {hb.timestamp} is more than "
                f"{self.settings.heartbeat_skew_s}s from the market clock {int(now)}"
            )
        message = Heartbeat(
            provider=provider, advert_hash=advert_hash(raw_advert), timestamp=hb.timestamp
        )
        signer = recover("Heartbeat", fast_digest(message, self.domain), hb.signature)
        if signer != provider.lower():
            raise AuthError(f"heartbeat signed by {signer}, not by {provider}")
        self.address_limiter.take(provider)
        if self.guards_funds():
            self.funds.check_provider(provider)
        advert = hb.advert
        with self.session() as session:
            row = storage.get_provider(session=session, address=provider)
            if row is not None and hb.timestamp <= row.heartbeat_ts:
                raise ReplayError(
                    f"heartbeat timestamp {hb.timestamp} is not after {row.heartbeat_ts}"
                )
            back = row is None or row.last_seen < now - self.funds.provider_ttl_s
            values: dict[str, Any] = {
                "device_class": advert.device_class,
                "device_kind": advert.device_kind,
                "device_count": advert.device_count,
                "price": advert.price,
                "throughput": advert.throughput,
                "capacity": advert.capacity,
                "endpoint": advert.endpoint,
                "last_seen": now,
                "online": True,
                "heartbeat_ts": hb.timestamp,
                "advert_json": json.dumps(raw_advert),
            }
            if row is None:
                row = Provider(address=provider, **values)
            else:
                for key, value in values.items():
                    setattr(row, key, value)
            session.add(row)
            session.commit()
            sums = chain_index.provider_clients(session=session, providers=[provider])
        self.funds.seen(provider, now, advert.device_class)
        self.changed()
        if back:  # its asks the gate held back trade now, against the bids resting
            self.rematch()
        return provider_public(row, sums.get(provider, []), self.settings.reputation_prior)

    def _paying_bidders(self, session: Session, device_class: str, now: int) -> set[str] | None:
        """Return the owners whose bids the book shows (`market.bidders`); None without a gate."""
        return self.bidders.owners(session, device_class, now) if self.guards_funds() else None

    def refresh_bidders(self, limit: int = BIDDERS_PER_PASS) -> int:
        """Read afresh the balances of up to `limit` owners of live bids (`market.bidders`)."""
        return self.bidders.refresh(limit) if self.guards_funds() else 0

    def rematch(self) -> int:
        """Match again the resting orders the match gate held back (a provider back, a client
        that deposited) and commit their fills; return how many (`Writer.rematch`)."""
        if not self.guards_funds():
            return 0
        changes = self.funds.changes()
        self.commitments.figures("", self.now())  # deals past the hold stop counting now
        if changes == self._rematched_at and self.funds.changes() == changes:
            return 0  # nothing the gate answers grew since the last pass: nothing new trades
        self._rematched_at = self.funds.changes()
        fills = self.writer.rematch(self.now(), self.clock())
        if fills:
            self.metrics.rematched.inc(fills)
            self.changed()
        return fills

    def mark_offline(self) -> int:
        """Mark providers silent for longer than the setting offline; return how many."""
        cutoff = self.clock() - self.settings.provider_offline_after_s
        with self.session() as session:
            gone = storage.mark_offline(session=session, seen_before=cutoff)
            session.commit()
            online = len(storage.list_providers(session=session, online_only=True))
        self.metrics.providers_online.set(online)
        if gone:
            self.changed()
        return len(gone)
