"""The market's SQL database: its URL, its engine and its schema (tables and indexes)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config
from sqlalchemy import event
from sqlalchemy.engine import Engine
from sqlmodel import create_engine

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
            # Keep the hot pages of the indexes in memory (64 MiB a connection, bounded). The
            # file is read, not mapped: mapped pages of a growing database count in the
            # process's resident memory with every order stored (35 MB per 100k dead orders,
            # docs/benchmarks.md), read ones only within the bounded cache.
            cursor.execute("PRAGMA cache_size=-65536")
            cursor.execute("PRAGMA mmap_size=0")
            cursor.execute("PRAGMA temp_store=MEMORY")
            cursor.close()

        return engine
    return create_engine(url, pool_size=8, max_overflow=8, pool_pre_ping=True)


MIGRATIONS = Path(__file__).with_name("migrations")
"""The Alembic environment of the schema (`env.py`, `versions/`), shipped in the package."""


def init_db(*, engine: Engine) -> None:
    """Bring the database to the newest schema: run the migrations it has not had, in one
    transaction (all of them on a new database; on one an older market wrote without
    migrations, the first creates only what is missing, see its docstring)."""
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    with engine.begin() as connection:
        config.attributes["connection"] = connection
        command.upgrade(config, "head")
