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
import os
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import requests
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from sqlalchemy.exc import IntegrityError
from sqlmodel import Session
from web3.exceptions import Web3Exception

from contracts.binding import Chain, Escrow
from contracts.errors import ChainError
from contracts.messages import ZERO_ADDRESS, Domain, Plan, Quote
from contracts.orders import (
    CancelOrder,
    Heartbeat,
    advert_hash,
    market_domain,
)
from contracts.orders import digest as fast_digest
from contracts.typed_data import schema as typed_data_schema
from market import levels as levels_sql
from market import presenters, storage, tape
from market.auth import RateLimiter
from market.books import Books
from market.checkpoint import Checkpointer
from market.engine import MatchingEngine, Side
from market.errors import (
    AuthError,
    ChainUnavailableError,
    DuplicateOrderError,
    ForbiddenError,
    InvalidOrderError,
    MarketError,
    NotFoundError,
    OrderStateError,
    PayloadTooLargeError,
    ReplayError,
    SignatureExpiredError,
    UnknownOrderError,
)
from market.funds import FundsGuard, Reservation
from market.models import (
    CancelCreate,
    Deal,
    DealPublic,
    FillPublic,
    HeartbeatCreate,
    Order,
    OrderCreate,
    OrderPublic,
    PlaceResult,
    PlaceSummary,
    Provider,
    ProviderPublic,
    QuoteAttach,
    QuoteIn,
)
from market.presenters import (
    BookPublic,
    OfferPublic,
    deal_public,
    order_public,
    provider_public,
)
from market.presenters import reliability as reliability  # its home before `market.presenters`
from market.tape import StatsPublic
from market.verify import CheckedOrder, Verifier, checksum, recover
from market.writer import Placed, Writer


@dataclass
class Settings:
    """Configuration of one market process (see `from_env` for the environment variables)."""

    data_dir: Path = Path("data")
    database_url: str | None = None
    chain_id: int = 31337
    escrow: str = ZERO_ADDRESS
    rpc_url: str | None = None
    # Token buckets: orders (a batch costs its order count), cancels and heartbeats per signing
    # account, requests per client IP. Several source addresses do not widen a signer's bucket.
    rate_per_address: float = 200.0
    burst_per_address: float = 1_000.0
    rate_per_ip: float = 5_000.0  # above one client's pace (docs/market.md, "Rate limits")
    burst_per_ip: float = 10_000.0
    # Body caps per route (`market.api.body`), enforced while the body streams in.
    max_body_bytes: int = 1 << 20  # a batch; also the app-wide backstop
    max_order_bytes: int = 16 << 10
    max_heartbeat_bytes: int = 16 << 10
    max_small_body_bytes: int = 4 << 10  # a cancel, a quote attached to a deal
    max_batch: int = 500
    # Connections (`market.api.server`): idle keep-alive connections close after `keep_alive_s`;
    # a request must arrive whole (headers and body) within `request_read_timeout_s` of its
    # first byte, with at most `max_header_bytes` of request line and headers.
    keep_alive_s: float = 5.0
    request_read_timeout_s: float = 10.0
    max_header_bytes: int = 32 << 10
    max_connections: int = 4_096
    max_streams: int = 2_048  # live-update streams (`/v1/stream`) served at once ...
    max_streams_per_ip: int = 16  # ... and to one client address
    # Funds behind orders (`market.funds`), when the market knows its escrow: a bid needs its
    # signer's free escrow balance to cover it and its other commitments, an ask or a heartbeat
    # needs stake, an order needs a device class a staked provider advertises.
    require_funds: bool = True
    min_provider_stake: int = 1_000_000
    max_live_orders_per_owner: int = 1_000
    max_classes_per_provider: int = 16  # a run-time class and compile-<generation> classes
    unopened_deal_hold_s: int = 3_600  # a matched deal not opened on chain counts this long
    funds_cache_s: float = 2.0
    max_order_ttl_s: int = 30 * 24 * 3600
    heartbeat_skew_s: int = 300
    provider_offline_after_s: float = 60.0
    run_jobs: bool = True
    expire_every_s: float = 1.0
    offline_every_s: float = 5.0
    index_every_s: float = 2.0
    index_chunk_blocks: int = 2_000
    # The escrow's deployment block (nothing before it to index); None: the indexer finds it.
    index_from_block: int | None = None
    # The shortest challenge window an ask's quote may set, on top of the escrow's own minimum
    # (read once from the chain when the market knows the escrow); never below 1 s.
    min_challenge_window: int = 1
    # The prior of the reputation score, in token base units (docs/market.md, "Reputation").
    reputation_prior: int = 1_000_000
    # History kept on disk, in days (None keeps all): fills older than this and finished orders
    # whose expiry passed this long ago are deleted by the retention job (`storage.prune_history`).
    fills_retention_days: float | None = None
    orders_retention_days: float | None = None
    retention_every_s: float = 3_600.0

    @classmethod
    def from_env(cls, **overrides: Any) -> Settings:
        """Read `MARKET_DATA_DIR`, `DATABASE_URL`, `MARKET_CHAIN_ID`, `MARKET_ESCROW`, `RPC_URL`,
        `MARKET_FROM_BLOCK`, `MARKET_MIN_CHALLENGE_WINDOW`, `MARKET_FILLS_RETENTION_DAYS`,
        `MARKET_ORDERS_RETENTION_DAYS`."""
        env = os.environ
        values: dict[str, Any] = {
            "data_dir": Path(env.get("MARKET_DATA_DIR", "data")),
            "database_url": env.get("DATABASE_URL") or None,
            "chain_id": int(env.get("MARKET_CHAIN_ID", "31337")),
            "escrow": env.get("MARKET_ESCROW", ZERO_ADDRESS),
            "rpc_url": env.get("RPC_URL") or None,
            "index_from_block": _optional_int(env.get("MARKET_FROM_BLOCK")),
        }
        for name in ("fills_retention_days", "orders_retention_days"):
            if env.get(f"MARKET_{name.upper()}"):
                values[name] = float(env[f"MARKET_{name.upper()}"])
        if env.get("MARKET_MIN_CHALLENGE_WINDOW"):
            values["min_challenge_window"] = int(env["MARKET_MIN_CHALLENGE_WINDOW"])
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)


INLINE_VERIFY_ORDERS = 32
"""Requests with more orders are verified in a worker thread, off the event loop (32 orders
verify in ~5 ms; a 500-order batch would hold the loop ~75 ms)."""

TRANSIENT_CHAIN = (ChainError, OSError, requests.RequestException, Web3Exception, TimeoutError)
"""Errors that mean "the chain is unreachable now": retried later."""


def _optional_int(text: str | None) -> int | None:
    return int(text) if text else None


class _Metrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.orders = Counter(
            "market_orders_accepted_total",
            "Orders accepted",
            ["side", "device_class"],
            registry=registry,
        )
        self.rejected = Counter(
            "market_orders_rejected_total", "Orders rejected", ["reason"], registry=registry
        )
        self.fills = Counter("market_fills_total", "Fills", ["device_class"], registry=registry)
        self.volume = Counter(
            "market_fill_units_total", "Units traded", ["device_class"], registry=registry
        )
        self.place_seconds = Histogram(
            "market_place_seconds",
            "Time to verify, match and commit one placement request",
            registry=registry,
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0),
        )
        self.live_orders = Gauge(
            "market_live_orders", "Orders resting in the book", ["device_class"], registry=registry
        )
        self.providers_online = Gauge(
            "market_providers_online", "Providers with a recent heartbeat", registry=registry
        )
        self.indexed_block = Gauge(
            "market_indexed_block", "Last escrow block indexed", registry=registry
        )
        self.indexer_errors = Counter(
            "market_indexer_errors_total", "Indexer runs that failed", registry=registry
        )
        self.expired = Counter("market_orders_expired_total", "Orders expired", registry=registry)


class MarketService:
    """Everything the API does, without HTTP: verify, match, persist, query."""

    def __init__(
        self,
        settings: Settings,
        *,
        clock: Callable[[], float] = time.time,
        registry: CollectorRegistry | None = None,
    ) -> None:
        """Connect to the database (creating tables), restore every book, start the writer."""
        self.settings = settings
        self.clock = clock
        self.registry = registry or CollectorRegistry()
        self.metrics = _Metrics(self.registry)
        self.domain: Domain = market_domain(settings.chain_id, settings.escrow)
        self.escrow_domain = Domain(chain_id=settings.chain_id, verifying_contract=settings.escrow)
        self.verifier = Verifier(
            self.domain,
            self.escrow_domain,
            settings.max_order_ttl_s,
            min_challenge_window=self.min_challenge_window,
        )
        self._chain_lock = threading.Lock()
        self._escrow: Escrow | None = None
        self._min_window: int | None = None
        self._attach_lock = threading.Lock()
        self.funds = FundsGuard(
            read_escrow=self._read_escrow,
            session=self.session,
            book_classes=lambda: self.books.names(),
            min_provider_stake=settings.min_provider_stake,
            max_live_orders=settings.max_live_orders_per_owner,
            max_classes_per_provider=settings.max_classes_per_provider,
            unopened_deal_hold_s=settings.unopened_deal_hold_s,
            cache_s=settings.funds_cache_s,
            provider_ttl_s=settings.provider_offline_after_s,
        )
        self.db = storage.make_engine(
            url=storage.database_url(data_dir=settings.data_dir, url=settings.database_url)
        )
        storage.init_db(engine=self.db)
        self.address_limiter = RateLimiter(
            rate=settings.rate_per_address, burst=settings.burst_per_address
        )
        self.ip_limiter = RateLimiter(rate=settings.rate_per_ip, burst=settings.burst_per_ip)
        self._version = 0
        self._version_lock = threading.Lock()
        self.books = Books(self.db, self.now)
        for name, book in self.books.items():
            self._update_live_gauge(name, book.engine)
        gate = self.funds.gate if self.guards_funds() else None  # what may trade (market.funds)
        self.writer = Writer(books=self.books, db=self.db, on_commit=self._committed, gate=gate)
        self.checkpointer = (
            Checkpointer(self.db, lambda: self._version)
            if self.db.dialect.name == "sqlite"
            else None
        )

    # -- plumbing -------------------------------------------------------------------------------

    @contextmanager
    def session(self) -> Iterator[Session]:
        """Open a session (no autoflush surprises: callers commit explicitly)."""
        with Session(self.db, expire_on_commit=False) as session:
            yield session

    def close(self) -> None:
        """Finish queued writes, stop the writer and release the database connections."""
        self.writer.close()
        if self.checkpointer is not None:
            self.checkpointer.close()
        self.db.dispose()

    @property
    def version(self) -> int:
        """Return a counter that grows with every change (the live page polls it)."""
        return self._version

    def _changed(self) -> None:
        with self._version_lock:
            self._version += 1

    def now(self) -> int:
        """Return the market clock in whole unix seconds."""
        return int(self.clock())

    # -- the escrow -----------------------------------------------------------------------------

    def knows_escrow(self) -> bool:
        """Return whether the market can read its escrow (an RPC URL and an escrow address)."""
        return bool(self.settings.rpc_url) and self.settings.escrow.lower() != ZERO_ADDRESS

    def _read_escrow(self, read: Callable[[Escrow], Any]) -> Any:
        """Run `read` on the bound escrow; raise `ChainUnavailableError` if the chain is down."""
        try:
            with self._chain_lock:
                if self._escrow is None:
                    assert self.settings.rpc_url is not None
                    self._escrow = Chain(self.settings.rpc_url).escrow(self.settings.escrow)
                escrow = self._escrow
            return read(escrow)
        except TRANSIENT_CHAIN as exc:
            with self._chain_lock:
                self._escrow = None
            raise ChainUnavailableError(f"the escrow cannot be read now: {exc}") from exc

    def min_challenge_window(self) -> int:
        """Return the shortest challenge window a quote may set, in seconds (at least 1).

        The escrow's `minChallengeWindow()`, read once, when the market knows the escrow; the
        setting `min_challenge_window` if higher.
        """
        if self._min_window is None:
            floor = max(1, self.settings.min_challenge_window)
            if self.knows_escrow():
                floor = max(floor, int(self._read_escrow(lambda e: e.min_challenge_window())))
            self._min_window = floor
        return self._min_window

    def typed_data(self) -> dict[str, Any]:
        """Return the EIP-712 typed-data schema of every settlement message, for this escrow."""
        return typed_data_schema(self.escrow_domain)

    def device_classes(self) -> list[str]:
        """Return the device classes with a book, sorted."""
        return self.books.names()

    def engine_snapshot(self, device_class: str) -> dict[str, Any]:
        """Return one class's engine snapshot (plain data; used by tests and debugging)."""
        book = self.books.get(device_class)
        with book.lock:
            return dict(book.engine.snapshot())

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
                return self._deal_publics(session, [deal])[0]  # attached before: idempotent
            if deal.chain_deal_id is not None:
                raise ReplayError(f"deal {deal_id} is already open on chain")
            _check_deal_quote(q, plan, deal, Quote.from_json(json.loads(ask.quote_json)))
            now = self.now()
            if q.valid_until <= now:
                raise SignatureExpiredError(f"quote expired at {q.valid_until} (now {now})")
            if deal.quote_json is not None:
                held = QuoteIn.model_validate_json(deal.quote_json)
                if held.valid_until > now:
                    raise ReplayError(
                        f"deal {deal_id} has a quote valid until {held.valid_until}: one quote "
                        "per deal (another is accepted once it expired unused)"
                    )
                self._refuse_used_nonce(held.provider, held.nonce, "its expired quote")
            other = storage.quote_attached_elsewhere(
                session=session, quote_hash=quote_hash, deal_id=deal_id
            )
            if other is not None:
                raise ReplayError(f"this quote belongs to deal {other}")
            self._refuse_used_nonce(q.provider, q.nonce, "this quote")
            deal.quote_hash = quote_hash
            deal.quote_json = q.model_dump_json()
            deal.quote_signature = attach.quote_signature.lower()
            session.add(deal)
            session.commit()
            public = self._deal_publics(session, [deal])[0]
        self._changed()
        return public

    def _refuse_used_nonce(self, provider: str, nonce: int, what: str) -> None:
        """Raise `ReplayError` if the escrow saw the provider's quote nonce used or cancelled."""
        if self.knows_escrow() and self._read_escrow(lambda e: e.is_nonce_used(provider, nonce)):
            raise ReplayError(f"{what} cannot open a deal: nonce {nonce} is used on chain")

    def guards_funds(self) -> bool:
        """Return whether orders and heartbeats need escrow funds behind them (`market.funds`):
        the setting is on and the market can read its escrow."""
        return self.settings.require_funds and self.knows_escrow()

    def _reserve(self, checked: Sequence[CheckedOrder], now: int) -> Reservation | None:
        """Check verified orders' funds (`market.funds`) and hold them; None when funds are not
        required."""
        if not self.guards_funds():
            return None
        try:
            return self.funds.reserve(checked, now)
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
        return _results(self._placed(placed, started))

    def place_batch(self, orders_in: Sequence[OrderCreate]) -> list[PlaceSummary]:
        """Like `place`, answering each order's id, state and fills only (cheaper)."""
        checked, now, started = self._verify(orders_in)
        reservation = self._reserve(checked, now)
        try:
            placed = self.writer.place(checked, now)
        finally:
            if reservation is not None:
                reservation.release()
        return _summaries(self._placed(placed, started))

    async def place_async(self, orders_in: Sequence[OrderCreate]) -> list[PlaceResult]:
        """`place` for an event loop: verify (see `_place_async`), await the commit."""
        placed, started = await self._place_async(orders_in)
        return _results(self._placed(placed, started))

    async def place_batch_async(self, orders_in: Sequence[OrderCreate]) -> list[PlaceSummary]:
        """`place_batch` for an event loop: verify (see `_place_async`), await the commit."""
        placed, started = await self._place_async(orders_in)
        return _summaries(self._placed(placed, started))

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
        if self.guards_funds():
            reservation = await asyncio.to_thread(self._reserve, checked, now)
        try:
            placed = await asyncio.wrap_future(self.writer.submit(checked, now))
        finally:
            if reservation is not None:
                reservation.release()
        return placed, started

    def _verify(self, orders_in: Sequence[OrderCreate]) -> tuple[list[CheckedOrder], int, float]:
        """Check orders (signatures, expiry, duplicates, rate limits) for the writer; return
        them with the market clock and the start time."""
        if len(orders_in) > self.settings.max_batch:
            raise PayloadTooLargeError(f"at most {self.settings.max_batch} orders per batch")
        started = time.perf_counter()
        now = self.now()
        created = self.clock()
        check = self.verifier.order
        try:
            checked = [check(o, now, created) for o in orders_in]
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

    def _committed(self, results: list[list[Placed]]) -> None:
        """Count a committed group's orders and fills (runs in the writer thread)."""
        orders: dict[tuple[str, str], int] = {}
        fills: dict[str, tuple[int, int]] = {}
        for placed in results:
            for p in placed:
                order = p.checked.order
                key = (order.side.value, order.device_class)
                orders[key] = orders.get(key, 0) + 1
                for f in p.fills:
                    count, units = fills.get(f.device_class, (0, 0))
                    fills[f.device_class] = (count + 1, units + f.quantity)
        for (side, name), count in orders.items():
            self.metrics.orders.labels(side, name).inc(count)
        for name, (count, units) in fills.items():
            self.metrics.fills.labels(name).inc(count)
            self.metrics.volume.labels(name).inc(units)
        self._changed()

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
        row = self.writer.call(lambda: self._cancel(order_id, owner, cancel_in.nonce))
        self._changed()
        return order_public(row)

    def _cancel(self, order_id: str, owner: str, nonce: int) -> Order:
        """Cancel in the writer thread: claim the nonce, change the engine, commit."""
        book = next((b for _, b in self.books.items() if order_id in b.engine), None)
        if book is None:
            with self.session() as session:
                stored = storage.get_order(session=session, order_id=order_id)
            if stored is None:
                raise UnknownOrderError(order_id)
            # Past its expiry, so no longer in the engine: filled, cancelled or expired.
            raise OrderStateError(order_id, stored.state, "cancelled")
        with book.lock, self.session() as session:
            record = book.engine.record(order_id)
            if record.order.owner != owner:
                raise ForbiddenError(f"order {order_id} belongs to {record.order.owner}")
            connection = session.connection()
            replay = ReplayError(f"nonce {nonce} of {owner} was used before")
            if self.writer.nonce_used(owner, nonce):  # this runs in the writer thread
                raise replay
            try:
                storage.use_nonces(connection=connection, pairs=[(owner, nonce)])
            except IntegrityError:
                session.rollback()
                raise replay from None
            final = book.engine.cancel(order_id)  # may raise OrderStateError: nothing written
            try:
                storage.record_progress(
                    connection=connection,
                    updates=[(order_id, final.state.value, final.remaining)],
                )
                session.commit()
            except BaseException:
                session.rollback()
                self.books.rebuild([record.order.device_class])
                raise
            self.writer.claim_nonces([(owner, nonce)])
            row = storage.get_order(session=session, order_id=order_id)
        assert row is not None
        return row

    def expire_orders(self) -> int:
        """Expire every live order past its expiry, in every class; return how many."""
        total = self.writer.call(self._expire)
        if total:
            self.metrics.expired.inc(total)
            self._changed()
        return total

    def _expire(self) -> int:
        now = self.now()
        total = 0
        for name, book in self.books.items():
            with book.lock:
                remembered = len(book.engine)
                expired = book.engine.expire(now)
                if len(book.engine) < remembered:  # it forgot orders: so do the quote hashes
                    engine = book.engine
                    book.quote_hashes = {i: h for i, h in book.quote_hashes.items() if i in engine}
                self._update_live_gauge(name, book.engine)  # here, not on the placement path
                if not expired:
                    continue
                with self.session() as session:
                    try:
                        storage.record_progress(
                            connection=session.connection(),
                            updates=[(r.order_id, r.state.value, r.remaining) for r in expired],
                        )
                        session.commit()
                    except BaseException:
                        session.rollback()
                        self.books.rebuild([name])
                        raise
            total += len(expired)
        return total

    def _update_live_gauge(self, name: str, engine: MatchingEngine) -> None:
        """Set the live-orders gauge of one class (call with the class's lock held)."""
        live = sum(
            level.orders for side in (Side.BID, Side.ASK) for level in engine.depth(name, side)
        )
        self.metrics.live_orders.labels(name).set(live)

    # -- providers ------------------------------------------------------------------------------

    def heartbeat(self, hb: HeartbeatCreate, raw_advert: dict[str, Any]) -> ProviderPublic:
        """Record a provider's signed advert; return its registry entry."""
        now = self.clock()
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
            sums = storage.provider_clients(session=session, providers=[provider])
        self._changed()
        return provider_public(row, sums.get(provider, []), self.settings.reputation_prior)

    def mark_offline(self) -> int:
        """Mark providers silent for longer than the setting offline; return how many."""
        cutoff = self.clock() - self.settings.provider_offline_after_s
        with self.session() as session:
            gone = storage.mark_offline(session=session, seen_before=cutoff)
            session.commit()
            online = len(storage.list_providers(session=session, online_only=True))
        self.metrics.providers_online.set(online)
        if gone:
            self._changed()
        return len(gone)

    def providers(self) -> list[ProviderPublic]:
        """Return the registry with each provider's reputation from indexed on-chain value."""
        prior = self.settings.reputation_prior
        with self.session() as session:
            rows = storage.list_providers(session=session)
            sums = storage.provider_clients(session=session)
        return [provider_public(r, sums.get(r.address, []), prior) for r in rows]

    # -- reads ----------------------------------------------------------------------------------

    def book(
        self,
        device_class: str,
        levels: int = 50,
        *,
        plan: str | None = None,
        slo_ms: int | None = None,
        memory: int | None = None,
    ) -> BookPublic:
        """Return a class's live orders by price and terms, best first (`market.presenters`)."""
        now = self.now()
        owners = self._trading_providers()
        with self.session() as session:
            bids, asks = (
                levels_sql.book_levels(
                    session=session,
                    device_class=device_class,
                    side=side,
                    now=now,
                    limit=levels,
                    plan=plan,
                    slo_ms=slo_ms,
                    memory=memory,
                    owners=side_owners,
                )
                for side, side_owners in (("bid", None), ("ask", owners))
            )
            terms = levels_sql.book_terms(
                session=session, device_class=device_class, now=now, limit=presenters.MAX_CHOICES
            )
        return presenters.book_view(
            bids, asks, terms, device_class=device_class, plan=plan, slo_ms=slo_ms, memory=memory
        )

    def _trading_providers(self) -> set[str] | None:
        """Return the providers whose asks can trade now (a recent heartbeat) when the market
        matches only those (`guards_funds`), else None (every ask can)."""
        if not self.guards_funds():
            return None
        cutoff = self.clock() - self.settings.provider_offline_after_s
        with self.session() as session:
            rows = storage.list_providers(session=session)
        return {p.address for p in rows if p.last_seen >= cutoff}

    def offers(
        self,
        *,
        min_reliability: float | None = None,
        online_only: bool = False,
        sort: str = "price",
        limit: int = 100,
        **filters: Any,
    ) -> list[OfferPublic]:
        """Return live asks as offers with their providers' reputation (`market.presenters`);
        `filters` are those of `market.levels.ask_groups`."""
        with self.session() as session:
            groups = levels_sql.ask_groups(session=session, now=self.now(), **filters)
        return presenters.offers_view(
            groups,
            self.providers(),
            min_reliability=min_reliability,
            online_only=online_only,
            sort=sort,
            limit=limit,
        )

    def stats(self, device_class: str) -> StatsPublic:
        """Return a class's last price, 24 h change and volume."""
        with self.session() as session:
            return tape.class_stats(session=session, device_class=device_class, now=self.now())

    def order(self, order_id: str) -> OrderPublic:
        """Return one order; raise `UnknownOrderError` if there is none."""
        with self.session() as session:
            row = storage.get_order(session=session, order_id=order_id.lower())
        if row is None:
            raise UnknownOrderError(order_id)
        return order_public(row)

    def orders(
        self, *, owner: str | None, device_class: str | None, live_only: bool, limit: int
    ) -> list[OrderPublic]:
        """Return orders, newest first."""
        with self.session() as session:
            rows = storage.list_orders(
                session=session,
                owner=None if owner is None else checksum(owner),
                device_class=device_class,
                live_only=live_only,
                limit=limit,
            )
        return [order_public(r) for r in rows]

    def fills(self, *, device_class: str | None, limit: int) -> list[FillPublic]:
        """Return the latest fills, newest first."""
        with self.session() as session:
            return tape.recent_fills(session=session, device_class=device_class, limit=limit)

    def history(
        self, device_class: str, *, since: int, bucket_s: int
    ) -> list[tuple[int, int, int, int, int, int]]:
        """Return OHLCV bars of a class's fills."""
        with self.session() as session:
            return tape.price_history(
                session=session, device_class=device_class, since=since, bucket_s=bucket_s
            )

    def deals(self, *, party: str | None, limit: int) -> list[DealPublic]:
        """Return deal records (both signed orders, quote, settlement status), newest first."""
        with self.session() as session:
            rows = storage.list_deals(
                session=session, party=None if party is None else checksum(party), limit=limit
            )
            return self._deal_publics(session, rows)

    def deal(self, deal_id: str) -> DealPublic:
        """Return one deal record; raise `NotFoundError` if there is none."""
        with self.session() as session:
            row = storage.get_deal(session=session, deal_id=deal_id)
            if row is None:
                raise NotFoundError(f"no deal {deal_id!r}")
            return self._deal_publics(session, [row])[0]

    def _deal_publics(self, session: Session, rows: Sequence[Deal]) -> list[DealPublic]:
        orders = storage.orders_by_id(
            session=session, ids={i for d in rows for i in (d.bid_id, d.ask_id)}
        )
        chain = storage.chain_deals(
            session=session, ids={d.chain_deal_id for d in rows if d.chain_deal_id is not None}
        )
        return [deal_public(d, orders, chain.get(d.chain_deal_id or -1)) for d in rows]


def _results(placed: list[Placed]) -> list[PlaceResult]:
    return [PlaceResult.model_construct(order=_placed_order(p), fills=_fills(p)) for p in placed]


def _summaries(placed: list[Placed]) -> list[PlaceSummary]:
    return [
        PlaceSummary.model_construct(
            order_id=p.checked.order.order_id, state=p.state, remaining=p.remaining, fills=_fills(p)
        )
        for p in placed
    ]


def _fills(placed: Placed) -> list[FillPublic]:
    return [
        FillPublic.model_construct(
            id=f"{f.device_class}:{f.fill_id}",
            device_class=f.device_class,
            fill_id=f.fill_id,
            bid_id=f.bid_id,
            ask_id=f.ask_id,
            price=f.price,
            quantity=f.quantity,
            aggressor=f.aggressor.value,
            time=f.time,
        )
        for f in placed.fills
    ]


def _placed_order(placed: Placed) -> OrderPublic:
    c = placed.checked
    o = c.order
    return OrderPublic.model_construct(
        side=o.side.value,
        owner=o.owner,
        device_class=o.device_class,
        quantity=o.quantity,
        price=o.price,
        plan=o.plan,
        slo_ms=o.slo_ms,
        memory=o.memory,
        expiry=o.expiry,
        nonce=c.nonce,
        order_id=o.order_id,
        seq=placed.seq,
        state=placed.state,
        remaining=placed.remaining,
        filled=o.quantity - placed.remaining,
        created_at=c.created_at,
        signature=c.signature,
        quote=json.loads(c.quote_json) if c.quote_json else None,
        quote_signature=c.quote_signature,
    )


def _check_deal_quote(q: QuoteIn, plan: Plan, deal: Deal, terms: Quote) -> None:
    """Raise `InvalidOrderError` unless a deal's quote names its client and keeps the terms of
    the ask it matched (`terms`, the ask's quote) with a cap covering the deal's spend."""
    if q.client.lower() != deal.client.lower():
        raise InvalidOrderError("quote.client", q.client, f"must be the deal's {deal.client}")
    kept = {
        "arbiter": (q.arbiter.lower(), terms.arbiter.lower()),
        "stake": (q.stake, terms.stake),
        "penalty": (q.penalty, terms.penalty),
        "duration": (q.duration, terms.duration),
        "challenge_window": (q.challenge_window, terms.challenge_window),
        "slo_ms": (q.slo_ms, terms.slo_ms),
        "plan": (plan, terms.plan),
    }
    for name, (given, asked) in kept.items():
        if given != asked:
            raise InvalidOrderError(f"quote.{name}", given, "must keep the ask's terms")
    if q.max_spend < int(deal.max_spend):
        raise InvalidOrderError("quote.max_spend", q.max_spend, f"below deal's {deal.max_spend}")
