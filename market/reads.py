"""The read side of the market service: queries over the stored orders, fills, deals and
providers and over the in-memory books. Nothing here writes; `market.service.MarketService`
adds the writes."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from sqlalchemy.engine import Engine
from sqlmodel import Session

from contracts.messages import Domain
from contracts.typed_data import schema as typed_data_schema
from market import chain_index, presenters, storage, tape
from market import levels as levels_sql
from market.books import Books
from market.errors import ChainUnavailableError, NotFoundError, UnknownOrderError
from market.escrow_reader import EscrowReader
from market.models import Deal, DealPublic, FillPublic, OrderPublic, ProviderPublic
from market.partition import Partition
from market.presenters import BookPublic, OfferPublic, deal_public, order_public, provider_public
from market.settings import Settings
from market.tape import StatsPublic
from market.verify import checksum

HEALTH_CHAIN_S = 2.0
"""`MarketReads.health` asks the chain node at most this often."""


class MarketReads:
    """Queries of one market (its settings, clock, database, books and escrow set by the
    service that subclasses it)."""

    settings: Settings
    clock: Callable[[], float]
    db: Engine
    books: Books
    partition: Partition
    escrow: EscrowReader
    escrow_domain: Domain

    @contextmanager
    def session(self) -> Iterator[Session]:
        """Open a session (no autoflush surprises: callers commit explicitly)."""
        with Session(self.db, expire_on_commit=False) as session:
            yield session

    @contextmanager
    def snapshot(self) -> Iterator[Session]:
        """Open a session whose reads all see one committed version of the market: one read
        transaction (SQLite in WAL mode takes its snapshot at the first read; PostgreSQL runs
        it REPEATABLE READ). The writer commits each group whole, so every read of the session
        sees the books between the same two groups."""
        with Session(self.db, expire_on_commit=False) as session:
            if self.db.dialect.name == "sqlite":
                connection = session.connection()
                connection.exec_driver_sql("BEGIN")
            else:
                session.connection(execution_options={"isolation_level": "REPEATABLE READ"})
            try:
                yield session
            finally:
                session.rollback()

    def now(self) -> int:
        """Return the market clock in whole unix seconds."""
        return int(self.clock())

    def knows_escrow(self) -> bool:
        """Return whether the market can read its escrow (an RPC URL and an escrow address)."""
        return self.escrow.known()

    def guards_funds(self) -> bool:
        """Return whether orders and heartbeats need escrow funds behind them (`market.funds`):
        the setting is on and the market can read its escrow."""
        return self.settings.require_funds and self.knows_escrow()

    def health(self) -> dict[str, Any]:
        """Return what the market serves now and what is missing (`GET /v1/health`): reads
        are always served; with an escrow configured, the chain node must answer for orders,
        heartbeats and quotes that need the escrow (answered 503 with `Retry-After` while it
        does not). The node is asked at most every `HEALTH_CHAIN_S` seconds; no URL and no
        error text is given (they may carry a key)."""
        missing: list[str] = []
        chain: str = "none"
        if self.knows_escrow():
            chain = "ok" if self._chain_answers() else "unreachable"
            if chain != "ok":
                missing.append(
                    "chain: the node does not answer; reads are served, orders, heartbeats "
                    "and quotes that need the escrow are answered 503 until it does"
                )
        return {
            "status": "degraded" if missing else "ok",
            "chain": chain,
            "funds_check": self.guards_funds(),
            "missing": missing,
        }

    def _chain_answers(self) -> bool:
        now = time.monotonic()
        checked = getattr(self, "_chain_checked", None)
        if checked is not None and now - checked[0] < HEALTH_CHAIN_S:
            return bool(checked[1])
        try:
            self.escrow.head()
            answers = True
        except ChainUnavailableError:
            answers = False
        self._chain_checked = (now, answers)
        return answers

    def typed_data(self) -> dict[str, Any]:
        """Return the EIP-712 typed-data schema of every settlement message, for this escrow."""
        return typed_data_schema(self.escrow_domain)

    def device_classes(self) -> list[str]:
        """Return the device classes with a book, sorted (with other processes on the
        database, `market.partition`: every class with orders in it)."""
        if self.partition.shared:
            with self.session() as session:
                return storage.device_classes(session=session)
        return self.books.names()

    def engine_snapshot(self, device_class: str) -> dict[str, Any]:
        """Return one class's engine snapshot (plain data; used by tests and debugging)."""
        book = self.books.get(device_class)
        with book.lock:
            return dict(book.engine.snapshot())

    def providers(self) -> list[ProviderPublic]:
        """Return the registry with each provider's reputation from indexed on-chain value."""
        prior = self.settings.reputation_prior
        with self.session() as session:
            rows = storage.list_providers(session=session)
            sums = chain_index.provider_clients(session=session)
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
        with self.snapshot() as session:
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
                for side, side_owners in (
                    ("bid", self._paying_bidders(session, device_class, now)),
                    ("ask", self._trading_providers(session)),
                )
            )
            terms = levels_sql.book_terms(
                session=session, device_class=device_class, now=now, limit=presenters.MAX_CHOICES
            )
        return presenters.book_view(
            bids, asks, terms, device_class=device_class, plan=plan, slo_ms=slo_ms, memory=memory
        )

    def _paying_bidders(self, session: Session, device_class: str, now: int) -> set[str] | None:
        """Return the owners whose bids in `device_class` the book shows, or None (all): a
        market with a match gate leaves out the bids their owners can no longer pay for."""
        return None

    def _trading_providers(self, session: Session) -> set[str] | None:
        """Return the providers whose asks can trade now (a recent heartbeat) when the market
        matches only those (`guards_funds`), else None (every ask can)."""
        if not self.guards_funds():
            return None
        cutoff = self.clock() - self.settings.provider_offline_after_s
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
            return self.deal_publics(session, rows)

    def deal(self, deal_id: str) -> DealPublic:
        """Return one deal record; raise `NotFoundError` if there is none."""
        with self.session() as session:
            row = storage.get_deal(session=session, deal_id=deal_id)
            if row is None:
                raise NotFoundError(f"no deal {deal_id!r}")
            return self.deal_publics(session, [row])[0]

    def deal_publics(self, session: Session, rows: Sequence[Deal]) -> list[DealPublic]:
        orders = storage.orders_by_id(
            session=session, ids={i for d in rows for i in (d.bid_id, d.ask_id)}
        )
        chain = chain_index.chain_deals(
            session=session, ids={d.chain_deal_id for d in rows if d.chain_deal_id is not None}
        )
        return [deal_public(d, orders, chain.get(d.chain_deal_id or -1)) for d in rows]
