"""SQL storage of the market: keyword-only functions over a SQLModel session.

Hot paths (placing orders) use SQLAlchemy Core bulk statements; reads use the ORM. Nothing here
commits: the caller owns the transaction, so an order and its fills land together or not at all.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from sqlalchemy import Table, and_, delete, event, func, inspect, or_, update
from sqlalchemy.engine import Connection, Engine
from sqlmodel import Session, SQLModel, col, create_engine, select

from market.engine import SNAPSHOT_VERSION, SnapshotData
from market.engine.snapshot import OrderData
from market.models import (
    ChainDeal,
    ChainEvent,
    Deal,
    Fill,
    IndexerState,
    NonceUse,
    Order,
    Provider,
    ProviderClient,
)

SQLITE_FILE = "market.sqlite3"


def database_url(*, data_dir: Path, url: str | None) -> str:
    """Return `url` if given (PostgreSQL in production), else a SQLite file in `data_dir`."""
    if url:
        return (
            url.replace("postgresql://", "postgresql+psycopg://", 1)
            if url.startswith("postgresql://")
            else url
        )
    data_dir.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{data_dir / SQLITE_FILE}"


def make_engine(*, url: str) -> Engine:
    """Create the SQL engine; SQLite gets WAL, a busy timeout and fsync at checkpoints."""
    if url.startswith("sqlite"):
        engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": 30})

        @event.listens_for(engine, "connect")
        def _pragmas(dbapi_connection: Any, _record: Any) -> None:
            cursor = dbapi_connection.cursor()
            cursor.execute("PRAGMA journal_mode=WAL")
            # NORMAL in WAL mode: a commit survives a process crash (what "accepted" promises);
            # only an OS crash or power loss can drop the last transactions.
            cursor.execute("PRAGMA synchronous=NORMAL")
            # Checkpoints run in `market.checkpoint`'s thread; this is only a backstop (40 MB).
            cursor.execute("PRAGMA wal_autocheckpoint=10000")
            cursor.execute("PRAGMA foreign_keys=ON")
            # Keep the hot pages of the indexes in memory (64 MiB) and read the file mapped.
            cursor.execute("PRAGMA cache_size=-65536")
            cursor.execute("PRAGMA mmap_size=268435456")
            cursor.execute("PRAGMA temp_store=MEMORY")
            cursor.close()

        return engine
    return create_engine(url, pool_size=8, max_overflow=8, pool_pre_ping=True)


# Indexes no query used, or that another index serves; each cost page writes per placed order
# (dropped from older databases). `uq_orders_owner_nonce` serves the owner lookups.
_RETIRED_INDEXES = (
    "ix_orders_quote_hash",
    "ix_orders_owner",
    "ix_fills_bid_id",
    "ix_fills_ask_id",
    "ix_deals_chain_deal_id",
)


# The queries of the page and the API over tables that grow with history, each served by an
# index so its cost follows the rows it returns, not the rows ever stored: an owner's and a
# class's orders newest first (`list_orders`), a class's fills newest first and since a time
# (`market.tape`: recent fills, price history, 24 h statistics), the last fill id of a class
# (`load_snapshot`), deals newest first (`list_deals`).
_HISTORY_INDEXES = (
    "ix_orders_owner_created ON orders (owner, created_at)",
    "ix_orders_class_created ON orders (device_class, created_at)",
    "ix_orders_created ON orders (created_at)",
    "ix_fills_class_seq ON fills (device_class, seq)",
    "ix_fills_class_time ON fills (device_class, time)",
    "ix_fills_class_fill_id ON fills (device_class, fill_id)",
    "ix_deals_created ON deals (created_at)",
)


# Tables the chain indexer derives from the escrow's events, dependants first. They hold
# nothing the chain does not: when their shape changes they are dropped and indexed again.
CHAIN_TABLES = ("provider_clients", "chain_events", "chain_deals", "indexer_state")

LIVE_STATES = ("open", "partially_filled")
_LIVE_SQL = "('open', 'partially_filled')"


def init_db(*, engine: Engine) -> None:
    """Create the tables and indexes that do not exist yet; drop retired indexes; rebuild the
    chain index if an older version of the market wrote it."""
    _drop_stale_chain_index(engine)
    _number_fills(engine)
    SQLModel.metadata.create_all(engine)
    with engine.begin() as connection:
        # A database made before orders claimed their own nonces lacks this index (its orders'
        # nonces are in `nonces`, which `used_nonces` reads too, so they stay unique).
        connection.exec_driver_sql(
            "CREATE UNIQUE INDEX IF NOT EXISTS uq_orders_owner_nonce ON orders (owner, nonce)"
        )
        # Live orders by owner, for the funds check (`market.funds`): a partial index, so it
        # holds only resting orders and an owner's history is never scanned.
        connection.exec_driver_sql(
            "CREATE INDEX IF NOT EXISTS ix_orders_owner_live ON orders (owner) "
            f"WHERE state IN {_LIVE_SQL}"
        )
        for name in _RETIRED_INDEXES:
            connection.exec_driver_sql(f"DROP INDEX IF EXISTS {name}")
        for index in _HISTORY_INDEXES:
            connection.exec_driver_sql(f"CREATE INDEX IF NOT EXISTS {index}")


def _number_fills(engine: Engine) -> None:
    """Give the fills of a database made before fills had a global `seq` one, in the order of
    (time, class, fill id): the best the old rows tell."""
    if "fills" not in inspect(engine).get_table_names():
        return
    if "seq" in {c["name"] for c in inspect(engine).get_columns("fills")}:
        return
    with engine.begin() as connection:
        connection.exec_driver_sql("ALTER TABLE fills ADD COLUMN seq BIGINT")
        connection.exec_driver_sql(
            "UPDATE fills SET seq = r.n FROM (SELECT id, ROW_NUMBER() OVER "
            "(ORDER BY time, device_class, fill_id) AS n FROM fills) AS r WHERE fills.id = r.id"
        )
        connection.exec_driver_sql("CREATE INDEX IF NOT EXISTS ix_fills_seq ON fills (seq)")


def _drop_stale_chain_index(engine: Engine) -> None:
    """Drop the chain index if its deals lack a column this version indexes (it was written for
    an older escrow protocol); the indexer rebuilds it from the escrow's deployment block."""
    tables = set(inspect(engine).get_table_names())
    if "chain_deals" not in tables:
        return
    have = {c["name"] for c in inspect(engine).get_columns("chain_deals")}
    if set(_table(ChainDeal).c.keys()) <= have:
        return
    with engine.begin() as connection:
        for name in CHAIN_TABLES:
            connection.exec_driver_sql(f"DROP TABLE IF EXISTS {name}")
        if "deals" in tables:
            connection.exec_driver_sql("UPDATE deals SET chain_deal_id = NULL")


# -- orders -------------------------------------------------------------------------------------


def device_classes(*, session: Session) -> list[str]:
    """Return every device class that has orders, sorted."""
    rows = session.exec(select(Order.device_class).distinct()).all()
    return sorted(rows)


def _remembered(device_class: str, now: int) -> Any:
    """The orders of a class an engine remembers at `now`: live, or their expiry not past."""
    return and_(
        col(Order.device_class) == device_class,
        or_(col(Order.state).in_(("open", "partially_filled")), col(Order.expiry) > now),
    )


def load_snapshot(*, session: Session, device_class: str, now: int) -> SnapshotData:
    """Build the engine snapshot of one device class at `now` from its order and fill rows.

    Only the orders an engine remembers at `now` are loaded (see `MatchingEngine.expire`), so
    a restart reads the validity window, not the whole history.
    """
    rows = session.exec(
        select(Order).where(_remembered(device_class, now)).order_by(col(Order.seq))
    ).all()
    last_seq = session.exec(
        select(func.max(Order.seq)).where(Order.device_class == device_class)
    ).one()
    orders: list[OrderData] = [
        {
            "side": r.side,
            "order_id": r.order_id,
            "owner": r.owner,
            "device_class": r.device_class,
            "quantity": r.quantity,
            "price": r.price,
            "plan": r.plan,
            "slo_ms": r.slo_ms,
            "memory": r.memory,
            "expiry": r.expiry,
            "seq": r.seq,
            "state": r.state,
            "remaining": r.remaining,
        }
        for r in rows
    ]
    last_fill = session.exec(
        select(func.max(Fill.fill_id)).where(Fill.device_class == device_class)
    ).one()
    return {
        "version": SNAPSHOT_VERSION,
        "next_seq": (last_seq or 0) + 1,
        "next_fill_id": (last_fill or 0) + 1,
        "orders": orders,
    }


def ask_quote_hashes(*, session: Session, device_class: str, now: int) -> dict[str, str]:
    """Return the quote hash of every ask of a device class remembered at `now`, by order id."""
    rows = session.exec(
        select(Order.order_id, Order.quote_hash).where(
            _remembered(device_class, now), Order.side == "ask"
        )
    ).all()
    return {order_id: quote_hash for order_id, quote_hash in rows if quote_hash}


def used_nonces(*, connection: Connection) -> dict[str, set[int]]:
    """Return every nonce an order or a cancel used, by signer (EIP-55 form)."""
    used: dict[str, set[int]] = {}
    rows = connection.exec_driver_sql(
        "SELECT owner, nonce FROM orders UNION ALL SELECT owner, nonce FROM nonces"
    )
    for owner, nonce in rows:
        mine = used.get(owner)
        if mine is None:
            mine = used[owner] = set()
        mine.add(nonce)
    return used


def _table(model: type[SQLModel]) -> Table:
    table: Table = model.__table__  # type: ignore[attr-defined]
    return table


# Column orders of the rows the placement path writes as plain tuples (checked at import).
ORDER_COLUMNS = (
    "order_id",
    "side",
    "owner",
    "device_class",
    "quantity",
    "price",
    "plan",
    "slo_ms",
    "memory",
    "expiry",
    "nonce",
    "seq",
    "state",
    "remaining",
    "created_at",
    "signature",
    "quote_json",
    "quote_signature",
    "quote_hash",
)
FILL_COLUMNS = (
    "id",
    "device_class",
    "fill_id",
    "bid_id",
    "ask_id",
    "price",
    "quantity",
    "aggressor",
    "time",
    "seq",
)
DEAL_COLUMNS = (
    "deal_id",
    "device_class",
    "bid_id",
    "ask_id",
    "client",
    "provider",
    "price",
    "quantity",
    "max_spend",
    "created_at",
    "quote_hash",
)
_NONCE_COLUMNS = ("owner", "nonce")
for _model, _columns in ((Order, ORDER_COLUMNS), (Fill, FILL_COLUMNS), (NonceUse, _NONCE_COLUMNS)):
    assert set(_columns) == set(_table(_model).c.keys()), _model
assert set(DEAL_COLUMNS) <= set(_table(Deal).c.keys())


def _insert_many(
    connection: Connection, table: str, columns: Sequence[str], rows: Sequence[tuple[Any, ...]]
) -> None:
    """INSERT rows given as tuples in one executemany, past SQLAlchemy's per-row work."""
    marks = ", ".join([_placeholder(connection)] * len(columns))
    statement = f"INSERT INTO {table} ({', '.join(columns)}) VALUES ({marks})"
    connection.exec_driver_sql(statement, list(rows))


def _placeholder(connection: Connection) -> str:
    return "?" if connection.dialect.paramstyle == "qmark" else "%s"


def use_nonces(*, connection: Connection, pairs: Sequence[tuple[str, int]]) -> None:
    """Record (signer, nonce) pairs of cancels as used; raise IntegrityError if a cancel used one
    before (orders claim theirs in their own rows: the caller checks both, see `used_nonces`)."""
    _insert_many(connection, "nonces", _NONCE_COLUMNS, pairs)


def record_placement(
    *,
    connection: Connection,
    orders: Sequence[tuple[Any, ...]],
    updates: Sequence[tuple[str, str, int]],
    fills: Sequence[tuple[Any, ...]],
    deals: Sequence[tuple[Any, ...]],
) -> None:
    """Insert new orders, fills and deals (tuples in the `*_COLUMNS` orders); store updates."""
    if orders:
        _insert_many(connection, "orders", ORDER_COLUMNS, orders)
    if updates:
        record_progress(connection=connection, updates=updates)
    if fills:  # the caller's rows lack `seq`: number them after the last committed fill
        last = connection.exec_driver_sql("SELECT MAX(seq) FROM fills").scalar() or 0
        numbered = [(*row, last + i) for i, row in enumerate(fills, 1)]
        _insert_many(connection, "fills", FILL_COLUMNS, numbered)
    if deals:
        _insert_many(connection, "deals", DEAL_COLUMNS, deals)


def record_progress(*, connection: Connection, updates: Iterable[tuple[str, str, int]]) -> None:
    """Store (order id, state, remaining) of orders the engine changed."""
    params = [(state, remaining, order_id) for order_id, state, remaining in updates]
    if not params:
        return
    mark = _placeholder(connection)
    connection.exec_driver_sql(
        f"UPDATE orders SET state = {mark}, remaining = {mark} WHERE order_id = {mark}", params
    )


def prune_history(
    *,
    connection: Connection,
    now: int,
    fills_days: float | None,
    orders_days: float | None,
    limit: int = 10_000,
) -> tuple[int, int]:
    """Delete up to ``limit`` fills older than ``fills_days`` and up to ``limit`` orders that
    expired or were cancelled without trading, whose expiry passed more than ``orders_days``
    ago; return how many of each (None keeps them all). An order that traded stays: its deals
    show it.

    The newest fill of each class stays: the next fill's id and ``seq`` follow it (a fill's
    id is its deal's). An order past its expiry can never be placed again (its signature
    expired with it), so its row no longer guards its nonce.
    """
    mark = _placeholder(connection)
    fills = orders = 0
    if fills_days is not None:
        fills = connection.exec_driver_sql(
            f"DELETE FROM fills WHERE id IN (SELECT id FROM fills f WHERE time < {mark} AND "
            "seq < (SELECT MAX(seq) FROM fills l WHERE l.device_class = f.device_class) "
            f"LIMIT {int(limit)})",
            (now - int(fills_days * 86_400),),
        ).rowcount
    if orders_days is not None:
        orders = connection.exec_driver_sql(
            "DELETE FROM orders WHERE order_id IN (SELECT order_id FROM orders WHERE expiry < "
            f"{mark} AND state IN ('expired', 'cancelled') AND remaining = quantity "
            f"LIMIT {int(limit)})",
            (now - int(orders_days * 86_400),),
        ).rowcount
    return fills, orders


def get_order(*, session: Session, order_id: str) -> Order | None:
    """Return one order, or None."""
    return session.get(Order, order_id)


def list_orders(
    *,
    session: Session,
    owner: str | None = None,
    device_class: str | None = None,
    live_only: bool = False,
    limit: int = 100,
) -> list[Order]:
    """Return orders, newest first, filtered by owner (EIP-55 form), class and liveness."""
    query = select(Order)
    if owner is not None:
        query = query.where(Order.owner == owner)
    if device_class is not None:
        query = query.where(Order.device_class == device_class)
    if live_only:
        query = query.where(col(Order.state).in_(("open", "partially_filled")))
    return list(session.exec(query.order_by(col(Order.created_at).desc()).limit(limit)).all())


def commitments(*, session: Session, owner: str, now: int, deals_since: float) -> tuple[int, int]:
    """Return (live orders, committed spend) of `owner` (EIP-55 form): how many of its orders
    rest in a book, and the unfilled spend of its live bids plus the spend of its deals matched
    since `deals_since` and not open on chain. Summed in Python: no int64 SQL sum can overflow.
    """
    mark = _placeholder(session.connection())
    rows = session.connection().exec_driver_sql(
        f"SELECT side, price, remaining FROM orders WHERE owner = {mark} "
        f"AND state IN {_LIVE_SQL} AND expiry > {mark}",
        (owner, now),
    )
    live = 0
    spend = 0
    for side, price, remaining in rows:
        live += 1
        if side == "bid":
            spend += int(price) * int(remaining)
    deals = session.exec(
        select(Deal.price, Deal.quantity).where(
            Deal.client == owner, col(Deal.chain_deal_id).is_(None), Deal.created_at >= deals_since
        )
    ).all()
    spend += sum(int(price) * int(quantity) for price, quantity in deals)
    return live, spend


def live_ask_classes(*, session: Session, owner: str, now: int) -> list[str]:
    """Return the device classes where `owner` has live asks."""
    mark = _placeholder(session.connection())
    rows = session.connection().exec_driver_sql(
        f"SELECT DISTINCT device_class FROM orders WHERE owner = {mark} "
        f"AND state IN {_LIVE_SQL} AND expiry > {mark} AND side = 'ask'",
        (owner, now),
    )
    return [name for (name,) in rows]


# -- deals --------------------------------------------------------------------------------------


def get_deal(*, session: Session, deal_id: str) -> Deal | None:
    """Return one deal record, or None."""
    return session.get(Deal, deal_id)


def list_deals(*, session: Session, party: str | None = None, limit: int = 50) -> list[Deal]:
    """Return deal records, newest first; with `party` (EIP-55 form), those where it is client
    or provider."""
    query = select(Deal)
    if party is not None:
        query = query.where((Deal.client == party) | (Deal.provider == party))
    return list(session.exec(query.order_by(col(Deal.created_at).desc()).limit(limit)).all())


def chain_deals(*, session: Session, ids: Iterable[int]) -> dict[int, ChainDeal]:
    """Return indexed on-chain deals by id."""
    wanted = list(ids)
    if not wanted:
        return {}
    rows = session.exec(select(ChainDeal).where(col(ChainDeal.chain_deal_id).in_(wanted))).all()
    return {row.chain_deal_id: row for row in rows}


def orders_by_id(*, session: Session, ids: Iterable[str]) -> dict[str, Order]:
    """Return orders by id."""
    wanted = list(ids)
    if not wanted:
        return {}
    rows = session.exec(select(Order).where(col(Order.order_id).in_(wanted))).all()
    return {row.order_id: row for row in rows}


def link_chain_deal(
    *, session: Session, quote_hash: str, client: str, chain_deal_id: int
) -> Deal | None:
    """Attach an on-chain deal to the market deal record whose own quote opened it; return it.

    A deal's quote names its client and is attached to one record only, so the quote hash finds
    at most one record; an ask's quote (which names no client) opens nothing on chain.
    """
    deal = session.exec(
        select(Deal).where(
            Deal.quote_hash == quote_hash,
            col(Deal.quote_json).is_not(None),
            col(Deal.chain_deal_id).is_(None),
        )
    ).first()
    if deal is None or deal.client.lower() != client.lower():
        return None
    deal.chain_deal_id = chain_deal_id
    session.add(deal)
    return deal


def quote_attached_elsewhere(*, session: Session, quote_hash: str, deal_id: str) -> str | None:
    """Return the id of another deal record that holds the quote `quote_hash`, or None."""
    other: str | None = session.exec(
        select(Deal.deal_id).where(
            Deal.quote_hash == quote_hash,
            col(Deal.quote_json).is_not(None),
            Deal.deal_id != deal_id,
        )
    ).first()
    return other


# -- chain indexer ------------------------------------------------------------------------------


def indexed_block(*, session: Session, name: str) -> int | None:
    """Return the last block the indexer `name` finished, or None."""
    row = session.get(IndexerState, name)
    return None if row is None else row.block


def set_indexed_block(*, session: Session, name: str, block: int) -> None:
    """Record the last block the indexer `name` finished."""
    row = session.get(IndexerState, name)
    if row is None:
        session.add(IndexerState(name=name, block=block))
    else:
        row.block = block
        session.add(row)


def add_chain_event(
    *,
    session: Session,
    tx_hash: str,
    log_index: int,
    block_number: int,
    name: str,
    chain_deal_id: int | None,
    args: dict[str, Any],
) -> bool:
    """Store an event once; return False if it was stored before."""
    if session.get(ChainEvent, (tx_hash, log_index)) is not None:
        return False
    session.add(
        ChainEvent(
            tx_hash=tx_hash,
            log_index=log_index,
            block_number=block_number,
            name=name,
            chain_deal_id=chain_deal_id,
            args_json=json.dumps(args, default=str),
        )
    )
    return True


def get_chain_deal(*, session: Session, chain_deal_id: int) -> ChainDeal | None:
    """Return an indexed on-chain deal, or None."""
    return session.get(ChainDeal, chain_deal_id)


def reset_chain_index(*, session: Session) -> None:
    """Forget everything indexed (another escrow's events): deals, events, sums, positions."""
    for model in (ProviderClient, ChainEvent, ChainDeal, IndexerState):
        session.execute(delete(model))
    session.execute(update(Deal).values(chain_deal_id=None))


def indexer_names(*, session: Session) -> list[str]:
    """Return the names of every indexer that recorded a position."""
    return list(session.exec(select(IndexerState.name)).all())


def provider_client(*, session: Session, provider: str, client: str) -> ProviderClient:
    """Return the settlement sums of one (provider, client) pair, created empty if new."""
    row = session.get(ProviderClient, (provider, client))
    if row is None:
        row = ProviderClient(provider=provider, client=client)
        session.add(row)
    return row


def provider_clients(
    *, session: Session, providers: Iterable[str] | None = None
) -> dict[str, list[ProviderClient]]:
    """Return the per-client settlement sums of providers (all if None), by provider address."""
    query = select(ProviderClient)
    if providers is not None:
        query = query.where(col(ProviderClient.provider).in_(list(providers)))
    out: dict[str, list[ProviderClient]] = {}
    for row in session.exec(query).all():
        out.setdefault(row.provider, []).append(row)
    return out


# -- providers ----------------------------------------------------------------------------------


def get_provider(*, session: Session, address: str) -> Provider | None:
    """Return a provider's registry entry, or None."""
    return session.get(Provider, address)


def list_providers(*, session: Session, online_only: bool = False) -> list[Provider]:
    """Return providers, most recently seen first."""
    query = select(Provider)
    if online_only:
        query = query.where(col(Provider.online).is_(True))
    return list(session.exec(query.order_by(col(Provider.last_seen).desc())).all())


def advertised_classes(*, session: Session) -> list[str]:
    """Return the device classes registered providers advertise."""
    return list(session.exec(select(Provider.device_class).distinct()).all())


def open_deal_stakes(*, session: Session, provider: str) -> int:
    """Return the stake `provider` has locked in its indexed deals not closed on chain."""
    rows = session.exec(
        select(ChainDeal.stake).where(ChainDeal.provider == provider, ChainDeal.status != "closed")
    ).all()
    return sum(int(stake) for stake in rows)


def mark_offline(*, session: Session, seen_before: float) -> list[str]:
    """Mark providers not seen since `seen_before` offline; return their addresses."""
    rows = session.exec(
        select(Provider).where(col(Provider.online).is_(True), Provider.last_seen < seen_before)
    ).all()
    for row in rows:
        row.online = False
        session.add(row)
    return [row.address for row in rows]
