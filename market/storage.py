"""SQL storage of the market's orders, deals and provider registry: keyword-only functions
over a SQLModel session.

Hot paths (placing orders) use SQLAlchemy Core bulk statements; reads use the ORM. Nothing here
commits: the caller owns the transaction, so an order and its fills land together or not at all.
The database itself (engine, schema) is `market.database`; the chain index, `market.chain_index`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from operator import attrgetter
from typing import Any, cast

from sqlalchemy import Table, and_, func
from sqlalchemy.engine import Connection
from sqlmodel import Session, SQLModel, col, select

from market.engine import ORDER_FIELDS, SNAPSHOT_VERSION, SnapshotData
from market.engine import Order as EngineOrder
from market.engine.snapshot import RECORD_FIELDS, OrderData
from market.models import Deal, Fill, NonceUse, Order, Provider

LIVE_STATES = ("open", "partially_filled")


# -- orders -------------------------------------------------------------------------------------


DEVICE_CLASSES_SQL = (
    "WITH RECURSIVE c(x) AS (SELECT MIN(device_class) FROM orders UNION ALL "
    "SELECT (SELECT MIN(device_class) FROM orders WHERE device_class > c.x) FROM c "
    "WHERE c.x IS NOT NULL) SELECT x FROM c WHERE x IS NOT NULL"
)
"""Every device class with orders, one index probe per class (not a scan of every order's
index entry: a restart reads what is live, not the history)."""


def device_classes(*, session: Session) -> list[str]:
    """Return every device class that has orders, sorted."""
    rows = session.connection().exec_driver_sql(DEVICE_CLASSES_SQL)
    return sorted(name for (name,) in rows)


def _remembered(device_class: str, now: int) -> Any:
    """The orders of a class an engine remembers: the live ones (the market releases an order
    from memory once it is filled or cancelled, `market.writer`; a live one past its expiry is
    loaded so that the expiry job records it). Served by the class+state index; `now` is kept
    for callers."""
    del now
    return and_(
        col(Order.device_class) == device_class,
        col(Order.state).in_(("open", "partially_filled")),
    )


def load_snapshot(*, session: Session, device_class: str, now: int) -> SnapshotData:
    """Build the engine snapshot of one device class at `now` from its order and fill rows.

    Only the live orders are loaded (see `_remembered`), so a restart reads the live book,
    not the history.
    """
    rows = session.exec(
        select(Order).where(_remembered(device_class, now)).order_by(col(Order.seq))
    ).all()
    last_seq = session.exec(
        select(func.max(Order.seq)).where(Order.device_class == device_class)
    ).one()
    orders = [cast(OrderData, {name: getattr(r, name) for name in RECORD_FIELDS}) for r in rows]
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


def _table(model: type[SQLModel]) -> Table:
    table: Table = model.__table__  # type: ignore[attr-defined]
    return table


# Column orders of the rows the placement path writes as plain tuples (checked at import).
ORDER_STORED_FIELDS = (
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
"""What a stored order holds beside the engine's fields: its nonce, progress and signatures."""
ORDER_COLUMNS = (*ORDER_FIELDS, *ORDER_STORED_FIELDS)
"""The columns of an `orders` row as `order_row` builds it."""
_ENGINE_VALUES = attrgetter(*ORDER_FIELDS[1:])
assert ORDER_FIELDS[0] == "side"  # stored as its text


def order_row(order: EngineOrder, *stored: object) -> tuple[object, ...]:
    """Return an `orders` row (`ORDER_COLUMNS`): the engine order's fields, then `stored` (the
    values of `ORDER_STORED_FIELDS`, in that order)."""
    return (order.side.value, *_ENGINE_VALUES(order), *stored)


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
    marks = ", ".join([placeholder(connection)] * len(columns))
    statement = f"INSERT INTO {table} ({', '.join(columns)}) VALUES ({marks})"
    connection.exec_driver_sql(statement, list(rows))


def placeholder(connection: Connection) -> str:
    """Return the connection's parameter mark in SQL text (`?` on SQLite, `%s` on PostgreSQL)."""
    return "?" if connection.dialect.paramstyle == "qmark" else "%s"


def use_nonces(*, connection: Connection, pairs: Sequence[tuple[str, int]]) -> None:
    """Record (signer, nonce) pairs of cancels as used; raise IntegrityError if a cancel used one
    before (orders claim theirs in their own rows: the caller checks both)."""
    _insert_many(connection, "nonces", _NONCE_COLUMNS, pairs)


def record_placement(
    *,
    connection: Connection,
    orders: Sequence[tuple[Any, ...]],
    updates: Sequence[tuple[str, str, int]],
    fills: Sequence[tuple[Any, ...]],
    deals: Sequence[tuple[Any, ...]],
    last_fill_seq: int | None = None,
) -> int | None:
    """Insert new orders, fills and deals (tuples in the `*_COLUMNS` orders); store updates.

    The fills' rows lack `seq`: they are numbered after `last_fill_seq`, the last committed
    fill's (read from SQL when None, as it must be unless the caller is the only writer of
    fills and saw every commit). Return the last `seq` now used (None: no fill yet).
    """
    if orders:
        _insert_many(connection, "orders", ORDER_COLUMNS, orders)
    if updates:
        record_progress(connection=connection, updates=updates)
    if fills:
        last = last_fill_seq
        if last is None:
            last = connection.exec_driver_sql("SELECT MAX(seq) FROM fills").scalar() or 0
        numbered = [(*row, last + i) for i, row in enumerate(fills, 1)]
        _insert_many(connection, "fills", FILL_COLUMNS, numbered)
        last_fill_seq = last + len(fills)
    if deals:
        _insert_many(connection, "deals", DEAL_COLUMNS, deals)
    return last_fill_seq


def record_progress(*, connection: Connection, updates: Iterable[tuple[str, str, int]]) -> None:
    """Store (order id, state, remaining) of orders the engine changed."""
    params = [(state, remaining, order_id) for order_id, state, remaining in updates]
    if not params:
        return
    mark = placeholder(connection)
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
    mark = placeholder(connection)
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


def orders_by_id(*, session: Session, ids: Iterable[str]) -> dict[str, Order]:
    """Return orders by id."""
    wanted = list(ids)
    if not wanted:
        return {}
    rows = session.exec(select(Order).where(col(Order.order_id).in_(wanted))).all()
    return {row.order_id: row for row in rows}


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


def mark_offline(*, session: Session, seen_before: float) -> list[str]:
    """Mark providers not seen since `seen_before` offline; return their addresses."""
    rows = session.exec(
        select(Provider).where(col(Provider.online).is_(True), Provider.last_seen < seen_before)
    ).all()
    for row in rows:
        row.online = False
        session.add(row)
    return [row.address for row in rows]
