"""The market service: signed orders in, matches and deal records out, all persisted.

Single writer per device class: each class has its own `MatchingEngine` behind its own lock,
restored at start from the stored orders and fills. A write is answered only after its SQL
transaction committed; if the commit fails, the classes it touched are rebuilt from storage, so
the engines never hold an order the database does not.
"""

from __future__ import annotations

import functools
import json
import os
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from eth_utils.address import to_checksum_address
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from sqlalchemy.exc import IntegrityError
from sqlmodel import Session

from contracts.errors import SignatureError
from contracts.hashing import keccak256 as fast_keccak
from contracts.messages import ZERO_ADDRESS, Domain, Plan, Quote
from contracts.orders import (
    Ask,
    Bid,
    CancelOrder,
    Heartbeat,
    advert_hash,
    market_domain,
    plan_kind,
    recover_address,
)
from contracts.orders import digest as fast_digest
from contracts.orders import struct_hash as fast_struct_hash
from contracts.pricing import plan_is_valid
from market import storage
from market.auth import RateLimiter
from market.engine import Fill as EngineFill
from market.engine import MatchingEngine, OrderRecord, Side
from market.engine import Order as EngineOrder
from market.errors import (
    AuthError,
    DuplicateOrderError,
    ForbiddenError,
    InvalidOrderError,
    MarketError,
    NotFoundError,
    PayloadTooLargeError,
    ReplayError,
    SignatureExpiredError,
    UnknownOrderError,
)
from market.models import (
    BookPublic,
    CancelCreate,
    ChainDeal,
    Deal,
    DealPublic,
    FillPublic,
    HeartbeatCreate,
    LevelPublic,
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


@dataclass
class Settings:
    """Configuration of one market process (see `from_env` for the environment variables)."""

    data_dir: Path = Path("data")
    database_url: str | None = None
    chain_id: int = 31337
    escrow: str = ZERO_ADDRESS
    rpc_url: str | None = None
    rate_per_address: float = 5_000.0
    burst_per_address: float = 10_000.0
    rate_per_ip: float = 1_000.0
    burst_per_ip: float = 2_000.0
    max_body_bytes: int = 1 << 20
    max_batch: int = 500
    max_order_ttl_s: int = 30 * 24 * 3600
    heartbeat_skew_s: int = 300
    provider_offline_after_s: float = 60.0
    run_jobs: bool = True
    expire_every_s: float = 1.0
    offline_every_s: float = 5.0
    index_every_s: float = 2.0
    index_chunk_blocks: int = 2_000
    index_from_block: int = 0  # the escrow's deployment block: nothing before it to index

    @classmethod
    def from_env(cls, **overrides: Any) -> Settings:
        """Read `MARKET_DATA_DIR`, `DATABASE_URL`, `MARKET_CHAIN_ID`, `MARKET_ESCROW`, `RPC_URL`,
        `MARKET_FROM_BLOCK`."""
        env = os.environ
        values: dict[str, Any] = {
            "data_dir": Path(env.get("MARKET_DATA_DIR", "data")),
            "database_url": env.get("DATABASE_URL") or None,
            "chain_id": int(env.get("MARKET_CHAIN_ID", "31337")),
            "escrow": env.get("MARKET_ESCROW", ZERO_ADDRESS),
            "rpc_url": env.get("RPC_URL") or None,
            "index_from_block": int(env.get("MARKET_FROM_BLOCK", "0")),
        }
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)


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


class _ClassBook:
    """One device class: its engine, its writer lock and its asks' quote hashes."""

    def __init__(self, engine: MatchingEngine, quote_hashes: dict[str, str]) -> None:
        self.engine = engine
        self.lock = threading.Lock()
        self.quote_hashes = quote_hashes


@dataclass(frozen=True)
class _Checked:
    """A verified order ready for the engine."""

    order: EngineOrder
    row: dict[str, Any]
    nonce: tuple[str, int]


def reliability(tasks_paid: int, refunds: int, disputes_lost: int) -> float:
    """Return the share of good outcomes with a uniform prior: (good + 1) / (all + 2)."""
    return (tasks_paid + 1) / (tasks_paid + refunds + disputes_lost + 2)


class MarketService:
    """Everything the API does, without HTTP: verify, match, persist, query."""

    def __init__(
        self,
        settings: Settings,
        *,
        clock: Callable[[], float] = time.time,
        registry: CollectorRegistry | None = None,
    ) -> None:
        """Connect to the database (creating tables) and restore every device class's book."""
        self.settings = settings
        self.clock = clock
        self.registry = registry or CollectorRegistry()
        self.metrics = _Metrics(self.registry)
        self.domain: Domain = market_domain(settings.chain_id, settings.escrow)
        self.escrow_domain = Domain(chain_id=settings.chain_id, verifying_contract=settings.escrow)
        self.db = storage.make_engine(
            url=storage.database_url(data_dir=settings.data_dir, url=settings.database_url)
        )
        storage.init_db(engine=self.db)
        self.address_limiter = RateLimiter(
            rate=settings.rate_per_address, burst=settings.burst_per_address
        )
        self.ip_limiter = RateLimiter(rate=settings.rate_per_ip, burst=settings.burst_per_ip)
        self._classes: dict[str, _ClassBook] = {}
        self._classes_lock = threading.Lock()
        self._version = 0
        self._version_lock = threading.Lock()
        with self.session() as session:
            for device_class in storage.device_classes(session=session):
                book = self._classes[device_class] = self._restore(session, device_class)
                self._update_live_gauge(device_class, book.engine)

    # -- plumbing -------------------------------------------------------------------------------

    @contextmanager
    def session(self) -> Iterator[Session]:
        """Open a session (no autoflush surprises: callers commit explicitly)."""
        with Session(self.db, expire_on_commit=False) as session:
            yield session

    def close(self) -> None:
        """Release the database connections."""
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

    def _restore(self, session: Session, device_class: str) -> _ClassBook:
        snapshot = storage.load_snapshot(session=session, device_class=device_class)
        engine = MatchingEngine.restore(snapshot)  # type: ignore[arg-type]
        hashes = storage.ask_quote_hashes(session=session, device_class=device_class)
        return _ClassBook(engine, hashes)

    def _book(self, device_class: str) -> _ClassBook:
        book = self._classes.get(device_class)
        if book is None:
            with self._classes_lock:
                book = self._classes.get(device_class)
                if book is None:
                    with self.session() as session:
                        book = self._classes[device_class] = self._restore(session, device_class)
        return book

    def _rebuild(self, device_classes: Sequence[str]) -> None:
        """Reload classes from storage after a failed write (the engine got ahead of SQL)."""
        with self.session() as session:
            for device_class in device_classes:
                fresh = self._restore(session, device_class)
                book = self._classes[device_class]
                book.engine = fresh.engine
                book.quote_hashes = fresh.quote_hashes

    def device_classes(self) -> list[str]:
        """Return the device classes with a book, sorted."""
        return sorted(self._classes)

    def engine_snapshot(self, device_class: str) -> dict[str, Any]:
        """Return one class's engine snapshot (plain data; used by tests and debugging)."""
        book = self._book(device_class)
        with book.lock:
            return dict(book.engine.snapshot())

    # -- orders ---------------------------------------------------------------------------------

    def check_order(self, order_in: OrderCreate, now: int) -> _Checked:
        """Verify one signed order; return its engine form and row, or raise a MarketError."""
        owner = checksum(order_in.owner)
        fields: dict[str, Any] = {
            "owner": owner,
            "device_class": order_in.device_class,
            "quantity": order_in.quantity,
            "price": order_in.price,
            "plan": order_in.plan,
            "slo_ms": order_in.slo_ms,
            "memory": order_in.memory,
            "expiry": order_in.expiry,
            "nonce": order_in.nonce,
        }
        quote_json: str | None = None
        quote_hash: str | None = None
        message: Ask | Bid
        if order_in.expiry <= now:
            raise SignatureExpiredError(f"order expired at {order_in.expiry} (now {now})")
        if order_in.expiry > now + self.settings.max_order_ttl_s:
            raise InvalidOrderError(
                "expiry", order_in.expiry, f"more than {self.settings.max_order_ttl_s}s ahead"
            )
        if order_in.side == "ask":
            quote_struct = self._check_quote(order_in, owner)
            assert order_in.quote is not None
            quote_json = order_in.quote.model_dump_json()
            quote_hash = "0x" + quote_struct.hex()
            message = Ask(**fields, quote_hash=quote_struct)
        else:
            if order_in.quote is not None or order_in.quote_signature is not None:
                raise InvalidOrderError("quote", "...", "a bid carries no quote")
            message = Bid(**fields)
        order_digest = fast_digest(message, self.domain)
        signer = _recover(message.TYPE_NAME, order_digest, order_in.signature)
        if signer != owner.lower():
            raise AuthError(f"order signed by {signer}, not by its owner {owner}")
        order_id = "0x" + order_digest.hex()
        engine_order = EngineOrder(
            side=Side(order_in.side),
            order_id=order_id,
            owner=owner,
            device_class=order_in.device_class,
            quantity=order_in.quantity,
            price=order_in.price,
            plan=order_in.plan,
            slo_ms=order_in.slo_ms,
            memory=order_in.memory,
            expiry=order_in.expiry,
        )
        row = {
            "order_id": order_id,
            "side": order_in.side,
            **fields,
            "created_at": self.clock(),
            "signature": order_in.signature.lower(),
            "quote_json": quote_json,
            "quote_signature": order_in.quote_signature.lower()
            if order_in.quote_signature
            else None,
            "quote_hash": quote_hash,
        }
        return _Checked(engine_order, row, (owner, order_in.nonce))

    def _check_quote(self, order_in: OrderCreate, owner: str) -> bytes:
        """Check an ask's quote and its signature; return the quote's struct hash."""
        q = order_in.quote
        if q is None or order_in.quote_signature is None:
            raise InvalidOrderError("quote", None, "an ask carries the provider's signed quote")
        if q.provider.lower() != owner.lower():
            raise InvalidOrderError("quote.provider", q.provider, "must be the ask's owner")
        if q.client.lower() != ZERO_ADDRESS:
            raise InvalidOrderError("quote.client", q.client, "an ask's quote is open (0x0)")
        if q.arbiter.lower() == ZERO_ADDRESS or q.duration == 0 or q.max_spend == 0:
            raise InvalidOrderError("quote", "...", "needs an arbiter, a duration and a cap")
        plan = Plan(**q.plan.model_dump())
        if not plan_is_valid(plan):
            raise InvalidOrderError("quote.plan", "...", "discounts above 100% or tiers unordered")
        if plan_kind(plan) != order_in.plan:
            raise InvalidOrderError(
                "plan", order_in.plan, f"the quote's plan is {plan_kind(plan)!r}"
            )
        if q.slo_ms != order_in.slo_ms:
            raise InvalidOrderError("quote.slo_ms", q.slo_ms, "must equal the ask's slo_ms")
        if q.valid_until < order_in.expiry:
            raise InvalidOrderError(
                "quote.valid_until", q.valid_until, "must last as long as the ask"
            )
        return self._verify_quote(q, plan, order_in.quote_signature, owner)

    def _verify_quote(self, q: QuoteIn, plan: Plan, signature: str, provider: str) -> bytes:
        """Return the quote's struct hash if `provider` signed it under the escrow domain."""
        quote = Quote(
            provider=q.provider,
            client=q.client,
            arbiter=q.arbiter,
            max_spend=q.max_spend,
            stake=q.stake,
            penalty=q.penalty,
            duration=q.duration,
            challenge_window=q.challenge_window,
            slo_ms=q.slo_ms,
            valid_until=q.valid_until,
            nonce=q.nonce,
            plan=plan,
        )
        quote_struct = fast_struct_hash(quote)
        quote_digest = keccak_digest(self.escrow_domain, quote_struct)
        signer = _recover("Quote", quote_digest, signature)
        if signer != provider.lower():
            raise AuthError(f"quote signed by {signer}, not by the provider {provider}")
        return quote_struct

    def attach_quote(self, deal_id: str, attach: QuoteAttach) -> DealPublic:
        """Give a matched deal its own signed quote (the ask's quote opens only one deal).

        The provider signs the quote under the escrow domain, which is the authentication;
        the quote must keep the ask's terms (plan, SLO), cover the deal's spend, name the deal's
        client or nobody, and the deal must not be open on chain yet.
        """
        q = attach.quote
        with self.session() as session:
            deal = storage.get_deal(session=session, deal_id=deal_id)
            if deal is None:
                raise NotFoundError(f"no deal {deal_id!r}")
            ask = storage.get_order(session=session, order_id=deal.ask_id)
            assert ask is not None
            if deal.chain_deal_id is not None:
                raise ReplayError(f"deal {deal_id} is already open on chain")
            if q.provider.lower() != deal.provider.lower():
                raise ForbiddenError(f"deal {deal_id} belongs to provider {deal.provider}")
            if q.client.lower() not in (ZERO_ADDRESS, deal.client.lower()):
                raise InvalidOrderError("quote.client", q.client, "must be the deal's client")
            if q.arbiter.lower() == ZERO_ADDRESS or q.duration == 0:
                raise InvalidOrderError("quote", "...", "needs an arbiter and a duration")
            if q.max_spend < int(deal.max_spend):
                raise InvalidOrderError("quote.max_spend", q.max_spend, "below the deal's spend")
            plan = Plan(**q.plan.model_dump())
            if not plan_is_valid(plan) or plan_kind(plan) != ask.plan:
                raise InvalidOrderError("quote.plan", plan_kind(plan), f"must be {ask.plan!r}")
            if q.slo_ms != ask.slo_ms:
                raise InvalidOrderError("quote.slo_ms", q.slo_ms, "must equal the ask's slo_ms")
            if q.valid_until <= self.now():
                raise SignatureExpiredError(f"quote expired at {q.valid_until}")
            struct = self._verify_quote(q, plan, attach.quote_signature, deal.provider)
            deal.quote_hash = "0x" + struct.hex()
            deal.quote_json = q.model_dump_json()
            deal.quote_signature = attach.quote_signature.lower()
            session.add(deal)
            session.commit()
            public = self._deal_publics(session, [deal])[0]
        self._changed()
        return public

    def place(self, orders_in: Sequence[OrderCreate]) -> list[PlaceResult]:
        """Verify, match and persist a batch atomically; return each order and its fills."""
        return [
            PlaceResult.model_construct(order=_order_public_from_row(row), fills=fills)
            for row, fills in self._place(orders_in)
        ]

    def place_batch(self, orders_in: Sequence[OrderCreate]) -> list[PlaceSummary]:
        """Like `place`, answering each order's id, state and fills only (cheaper)."""
        return [
            PlaceSummary.model_construct(
                order_id=row["order_id"],
                state=row["state"],
                remaining=row["remaining"],
                fills=fills,
            )
            for row, fills in self._place(orders_in)
        ]

    def _place(
        self, orders_in: Sequence[OrderCreate]
    ) -> list[tuple[dict[str, Any], list[FillPublic]]]:
        if len(orders_in) > self.settings.max_batch:
            raise PayloadTooLargeError(f"at most {self.settings.max_batch} orders per batch")
        started = time.perf_counter()
        now = self.now()
        try:
            checked = [self.check_order(o, now) for o in orders_in]
        except MarketError as exc:
            self.metrics.rejected.labels(type(exc).__name__).inc()
            raise
        per_owner: dict[str, int] = {}
        seen_ids: set[str] = set()
        seen_nonces: set[tuple[str, int]] = set()
        for c in checked:
            per_owner[c.order.owner] = per_owner.get(c.order.owner, 0) + 1
            if c.order.order_id in seen_ids:
                raise DuplicateOrderError(c.order.order_id)
            if c.nonce in seen_nonces:
                raise ReplayError(f"nonce {c.nonce[1]} of {c.nonce[0]} appears twice in batch")
            seen_ids.add(c.order.order_id)
            seen_nonces.add(c.nonce)
        for owner, count in per_owner.items():
            self.address_limiter.take(owner, count)
        classes = sorted({c.order.device_class for c in checked})
        books = {name: self._book(name) for name in classes}
        with ExitStack() as stack:
            for name in classes:
                stack.enter_context(books[name].lock)
            results = self._place_locked(checked, books, now)
        self.metrics.place_seconds.observe(time.perf_counter() - started)
        self._changed()
        return results

    def _place_locked(
        self, checked: list[_Checked], books: dict[str, _ClassBook], now: int
    ) -> list[tuple[dict[str, Any], list[FillPublic]]]:
        with self.session() as session:
            for c in checked:
                if c.order.order_id in books[c.order.device_class].engine:
                    raise DuplicateOrderError(c.order.order_id)
            # Claim the nonces first: the primary key rejects a reused one before the engine
            # changes, so a replay costs one failed insert, never a rebuild.
            try:
                storage.use_nonces(session=session, pairs=[c.nonce for c in checked])
            except IntegrityError:
                session.rollback()
                used = storage.used_nonces(session=session, pairs=[c.nonce for c in checked])
                owner, nonce = sorted(used)[0] if used else ("a signer", -1)
                raise ReplayError(f"nonce {nonce} of {owner} was used before") from None
            fills_per_order: list[list[EngineFill]] = []
            try:
                for c in checked:
                    book = books[c.order.device_class]
                    fills_per_order.append(book.engine.place(c.order, now=now))
                    if c.row["quote_hash"]:
                        book.quote_hashes[c.order.order_id] = c.row["quote_hash"]
                results, rows = self._rows(checked, fills_per_order, books)
                storage.record_placement(session=session, **rows)
                session.commit()
            except BaseException:
                session.rollback()
                self._rebuild(list(books))
                raise
        for c in checked:
            self.metrics.orders.labels(c.order.side.value, c.order.device_class).inc()
        for fills in fills_per_order:
            for f in fills:
                self.metrics.fills.labels(f.device_class).inc()
                self.metrics.volume.labels(f.device_class).inc(f.quantity)
        return results

    def _rows(
        self,
        checked: list[_Checked],
        fills_per_order: list[list[EngineFill]],
        books: dict[str, _ClassBook],
    ) -> tuple[list[tuple[dict[str, Any], list[FillPublic]]], dict[str, Any]]:
        new_ids = {c.order.order_id for c in checked}
        order_rows: list[dict[str, Any]] = []
        for c in checked:
            rec = books[c.order.device_class].engine.record(c.order.order_id)
            row = {**c.row, "seq": rec.seq, "state": rec.state.value, "remaining": rec.remaining}
            order_rows.append(row)
        touched: dict[str, OrderRecord] = {}
        fill_rows: list[dict[str, Any]] = []
        deal_rows: list[dict[str, Any]] = []
        results: list[tuple[dict[str, Any], list[FillPublic]]] = []
        created = self.clock()
        for c, fills, row in zip(checked, fills_per_order, order_rows, strict=True):
            book = books[c.order.device_class]
            fill_publics = []
            for f in fills:
                fill_id = f"{f.device_class}:{f.fill_id}"
                fill_row: dict[str, Any] = {
                    "id": fill_id,
                    "device_class": f.device_class,
                    "fill_id": f.fill_id,
                    "bid_id": f.bid_id,
                    "ask_id": f.ask_id,
                    "price": f.price,
                    "quantity": f.quantity,
                    "aggressor": f.aggressor.value,
                    "time": f.time,
                }
                fill_rows.append(fill_row)
                fill_publics.append(FillPublic.model_construct(**fill_row))
                engine = book.engine
                bid = engine.record(f.bid_id).order
                ask = engine.record(f.ask_id).order
                deal_rows.append(
                    {
                        "deal_id": fill_id,
                        "device_class": f.device_class,
                        "bid_id": f.bid_id,
                        "ask_id": f.ask_id,
                        "client": bid.owner,
                        "provider": ask.owner,
                        "price": f.price,
                        "quantity": f.quantity,
                        "max_spend": str(f.price * f.quantity),
                        "created_at": created,
                        "chain_deal_id": None,
                        "quote_hash": book.quote_hashes.get(f.ask_id, ""),
                        "quote_json": None,
                        "quote_signature": None,
                    }
                )
                maker = f.maker_id
                if maker not in new_ids:
                    touched[maker] = engine.record(maker)
            results.append((row, fill_publics))
        updates = [(i, r.state.value, r.remaining) for i, r in touched.items()]
        rows = {
            "orders": order_rows,
            "updates": updates,
            "fills": fill_rows,
            "deals": deal_rows,
        }
        return results, rows

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
        signer = _recover("CancelOrder", fast_digest(message, self.domain), cancel_in.signature)
        if signer != owner.lower():
            raise AuthError(f"cancel signed by {signer}, not by {owner}")
        self.address_limiter.take(owner)
        order_id = cancel_in.order_id.lower()
        book = next((b for b in self._classes.values() if order_id in b.engine), None)
        if book is None:
            raise UnknownOrderError(order_id)
        with book.lock:
            record = book.engine.record(order_id)
            if record.order.owner != owner:
                raise ForbiddenError(f"order {order_id} belongs to {record.order.owner}")
            with self.session() as session:
                try:
                    storage.use_nonces(session=session, pairs=[(owner, cancel_in.nonce)])
                except IntegrityError:
                    session.rollback()
                    raise ReplayError(
                        f"nonce {cancel_in.nonce} of {owner} was used before"
                    ) from None
                final = book.engine.cancel(order_id)
                try:
                    storage.record_progress(
                        session=session, updates=[(order_id, final.state.value, final.remaining)]
                    )
                    session.commit()
                except BaseException:
                    session.rollback()
                    self._rebuild([record.order.device_class])
                    raise
                row = storage.get_order(session=session, order_id=order_id)
        self._changed()
        assert row is not None
        return order_public(row)

    def expire_orders(self) -> int:
        """Expire every live order past its expiry, in every class; return how many."""
        now = self.now()
        total = 0
        for name, book in list(self._classes.items()):
            with book.lock:
                expired = book.engine.expire(now)
                self._update_live_gauge(name, book.engine)  # here, not on the placement path
                if not expired:
                    continue
                with self.session() as session:
                    try:
                        storage.record_progress(
                            session=session,
                            updates=[(r.order_id, r.state.value, r.remaining) for r in expired],
                        )
                        session.commit()
                    except BaseException:
                        session.rollback()
                        self._rebuild([name])
                        raise
            total += len(expired)
        if total:
            self.metrics.expired.inc(total)
            self._changed()
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
        signer = _recover("Heartbeat", fast_digest(message, self.domain), hb.signature)
        if signer != provider.lower():
            raise AuthError(f"heartbeat signed by {signer}, not by {provider}")
        self.address_limiter.take(provider)
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
            outcomes = storage.provider_outcomes(session=session)
        self._changed()
        return provider_public(row, outcomes)

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
        """Return the registry with reliability from indexed on-chain outcomes."""
        with self.session() as session:
            rows = storage.list_providers(session=session)
            outcomes = storage.provider_outcomes(session=session)
        return [provider_public(r, outcomes) for r in rows]

    # -- reads ----------------------------------------------------------------------------------

    def book(self, device_class: str, levels: int = 50) -> BookPublic:
        """Return both sides of a class's book by price level, best first."""
        book = self._classes.get(device_class)
        if book is None:
            return BookPublic(
                device_class=device_class, bids=[], asks=[], best_bid=None, best_ask=None
            )
        with book.lock:
            engine = book.engine
            bids = engine.depth(device_class, Side.BID, levels)
            asks = engine.depth(device_class, Side.ASK, levels)
            best_bid = engine.best_bid(device_class)
            best_ask = engine.best_ask(device_class)
        return BookPublic(
            device_class=device_class,
            bids=[LevelPublic(price=p, quantity=q, orders=n) for p, q, n in bids],
            asks=[LevelPublic(price=p, quantity=q, orders=n) for p, q, n in asks],
            best_bid=best_bid,
            best_ask=best_ask,
        )

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
                owner=owner,
                device_class=device_class,
                live_only=live_only,
                limit=limit,
            )
        return [order_public(r) for r in rows]

    def fills(self, *, device_class: str | None, limit: int) -> list[FillPublic]:
        """Return the latest fills, newest first."""
        with self.session() as session:
            rows = storage.recent_fills(session=session, device_class=device_class, limit=limit)
        return [FillPublic.model_validate(r, from_attributes=True) for r in rows]

    def history(
        self, device_class: str, *, since: int, bucket_s: int
    ) -> list[tuple[int, int, int, int, int, int]]:
        """Return OHLCV bars of a class's fills."""
        with self.session() as session:
            return storage.price_history(
                session=session, device_class=device_class, since=since, bucket_s=bucket_s
            )

    def deals(self, *, party: str | None, limit: int) -> list[DealPublic]:
        """Return deal records (both signed orders, quote, settlement status), newest first."""
        with self.session() as session:
            rows = storage.list_deals(session=session, party=party, limit=limit)
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


def _recover(type_name: str, digest: bytes, signature_hex: str) -> str:
    try:
        return recover_address(digest, bytes.fromhex(signature_hex[2:]))
    except (SignatureError, ValueError) as exc:
        raise AuthError(f"bad {type_name} signature: {exc}") from exc


@functools.lru_cache(maxsize=65_536)
def checksum(address: str) -> str:
    """Return the EIP-55 form of an address (cached: the same traders sign again and again)."""
    try:
        return to_checksum_address(address)
    except ValueError as exc:
        raise InvalidOrderError("address", address, "not an address") from exc


def keccak_digest(domain: Domain, struct: bytes) -> bytes:
    """Return the EIP-712 digest of a struct hash under `domain`."""
    return fast_keccak(b"\x19\x01" + domain.separator() + struct)


def _order_public_from_row(row: dict[str, Any]) -> OrderPublic:
    quote = json.loads(row["quote_json"]) if row.get("quote_json") else None
    return OrderPublic.model_construct(
        side=row["side"],
        owner=row["owner"],
        device_class=row["device_class"],
        quantity=row["quantity"],
        price=row["price"],
        plan=row["plan"],
        slo_ms=row["slo_ms"],
        memory=row["memory"],
        expiry=row["expiry"],
        nonce=row["nonce"],
        order_id=row["order_id"],
        seq=row["seq"],
        state=row["state"],
        remaining=row["remaining"],
        filled=row["quantity"] - row["remaining"],
        created_at=row["created_at"],
        signature=row["signature"],
        quote=quote,
        quote_signature=row.get("quote_signature"),
    )


def order_public(row: Order) -> OrderPublic:
    """Return the API view of a stored order."""
    return _order_public_from_row(row.model_dump())


def provider_public(row: Provider, outcomes: dict[str, tuple[int, int, int]]) -> ProviderPublic:
    """Return the API view of a provider with its verified outcomes."""
    paid, refunds, lost = outcomes.get(row.address.lower(), (0, 0, 0))
    return ProviderPublic(
        **{k: v for k, v in row.model_dump().items() if k in ProviderPublic.model_fields},
        tasks_paid=paid,
        refunds=refunds,
        disputes_lost=lost,
        reliability=round(reliability(paid, refunds, lost), 4),
    )


def deal_public(deal: Deal, orders: dict[str, Order], chain: ChainDeal | None) -> DealPublic:
    """Return the API view of a deal record with its on-chain settlement status."""
    bid = order_public(orders[deal.bid_id])
    ask = order_public(orders[deal.ask_id])
    if chain is None:
        status = "matched"
    elif chain.status == "closed":
        status = "closed"
    elif chain.refunds:
        status = "refunded" if not chain.tasks_paid else "paid"
    else:
        status = "paid" if chain.tasks_paid else "opened"
    quote = json.loads(deal.quote_json) if deal.quote_json else ask.quote
    quote_signature = deal.quote_signature if deal.quote_json else ask.quote_signature
    return DealPublic(
        deal_id=deal.deal_id,
        device_class=deal.device_class,
        client=deal.client,
        provider=deal.provider,
        price=deal.price,
        quantity=deal.quantity,
        max_spend=deal.max_spend,
        created_at=deal.created_at,
        bid=bid,
        ask=ask,
        quote=quote,
        quote_signature=quote_signature,
        quote_hash=deal.quote_hash,
        status=status,
        chain_deal_id=deal.chain_deal_id,
        tasks_paid=chain.tasks_paid if chain else 0,
        paid=chain.paid if chain else "0",
        refunds=chain.refunds if chain else 0,
        refunded=chain.refunded if chain else "0",
        opened_tx=chain.opened_tx if chain else None,
        last_tx=chain.last_tx if chain else None,
        closed_tx=chain.closed_tx if chain else None,
    )
