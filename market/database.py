"""The market's SQL database: its URL, its engine and its schema (tables and indexes)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sqlalchemy import event, inspect
from sqlalchemy.engine import Engine
from sqlmodel import SQLModel, create_engine

from market.storage import LIVE_STATES  # and, through it, the tables of `market.models`

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
            f"WHERE state IN ({', '.join(repr(s) for s in LIVE_STATES)})"
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
    if set(SQLModel.metadata.tables["chain_deals"].c.keys()) <= have:
        return
    with engine.begin() as connection:
        for name in CHAIN_TABLES:
            connection.exec_driver_sql(f"DROP TABLE IF EXISTS {name}")
        if "deals" in tables:
            connection.exec_driver_sql("UPDATE deals SET chain_deal_id = NULL")
