"""A database the last release without migrations wrote opens with this market: its rows stay,
its schema becomes the one a new database gets (both SQL backends)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sqlalchemy import inspect, text
from sqlalchemy.engine import Engine

from market import database
from market.service import MarketService
from market.settings import Settings

from .conftest import START, Clock, reset_postgres

RELEASE_SCHEMA = Path(__file__).with_name("release_schema")
"""The schema that release made, per backend (`release_schema/<dialect>.sql`, dumped from it)."""

ALICE = "0x" + "a1" * 20
BOB = "0x" + "b2" * 20
BID, ASK = "0x" + "01" * 32, "0x" + "02" * 32
ORDER = {
    "side": "bid",
    "owner": ALICE,
    "device_class": "tpu-v5e",
    "quantity": 3,
    "price": 95,
    "plan": "matmul",
    "slo_ms": 100,
    "memory": 0,
    "expiry": START - 600,
    "nonce": 7,
    "order_id": BID,
    "seq": 1,
    "state": "filled",
    "remaining": 0,
    "created_at": START - 900.5,
    "signature": "0x" + "ab" * 65,
    "quote_json": None,
    "quote_signature": None,
    "quote_hash": None,
}
ROWS: list[tuple[str, dict[str, Any]]] = [
    ("orders", ORDER),
    ("orders", {**ORDER, "side": "ask", "owner": BOB, "order_id": ASK, "seq": 2, "nonce": 1}),
    *(
        (
            "fills",
            {
                "id": f"{cls}:{fill_id}",
                "device_class": cls,
                "fill_id": fill_id,
                "bid_id": BID,
                "ask_id": ASK,
                "price": 95,
                "quantity": 1,
                "aggressor": "bid",
                "time": time,
            },
        )
        for cls, fill_id, time in (("tpu-v5e", 1, START - 800), ("cpu", 1, START - 700))
    ),
    (
        "fills",
        {
            "id": "tpu-v5e:2",
            "device_class": "tpu-v5e",
            "fill_id": 2,
            "bid_id": BID,
            "ask_id": ASK,
            "price": 96,
            "quantity": 2,
            "aggressor": "ask",
            "time": START - 750,
        },
    ),
    (
        "deals",
        {
            "deal_id": "tpu-v5e:1",
            "device_class": "tpu-v5e",
            "bid_id": BID,
            "ask_id": ASK,
            "client": ALICE,
            "provider": BOB,
            "price": 95,
            "quantity": 1,
            "max_spend": "95",
            "created_at": START - 800.0,
            "chain_deal_id": None,
            "quote_hash": "0x" + "03" * 32,
            "quote_json": None,
            "quote_signature": None,
        },
    ),
    ("nonces", {"owner": ALICE, "nonce": 8}),
    ("indexer_state", {"name": "escrow:0xabc", "block": 41}),
    (
        "providers",
        {
            "address": BOB,
            "device_class": "tpu-v5e",
            "device_kind": "TPU v5 lite",
            "device_count": 4,
            "price": 90,
            "throughput": 12.5,
            "capacity": 8,
            "endpoint": "http://127.0.0.1:9",
            "last_seen": START - 30.0,
            "online": True,
            "heartbeat_ts": START - 30,
            "advert_json": "{}",
        },
    ),
]


def release_schema(dialect: str) -> list[str]:
    """Return the statements that made the release's schema on `dialect`."""
    lines = (RELEASE_SCHEMA / f"{dialect}.sql").read_text().splitlines()
    script = "\n".join(line for line in lines if not line.startswith("--"))
    return [s.strip() for s in script.split(";") if s.strip()]


def options(dialect_options: Any) -> list[tuple[str, str]]:
    """Return an index's dialect options (a partial index's WHERE) as text."""
    return sorted((k, str(v)) for k, v in dict(dialect_options).items())


def schema(engine: Engine) -> dict[str, Any]:
    """Return every table's columns, primary key, indexes and unique constraints, as reflected."""
    inspector = inspect(engine)
    return {
        table: {
            "columns": {
                c["name"]: (str(c["type"]), c["nullable"], c.get("default"))
                for c in inspector.get_columns(table)
            },
            "primary_key": inspector.get_pk_constraint(table)["constrained_columns"],
            "indexes": sorted(
                (
                    i["name"],
                    tuple(i["column_names"]),
                    bool(i["unique"]),
                    options(i["dialect_options"]),
                )
                for i in inspector.get_indexes(table)
            ),
            "unique": sorted(
                (u["name"], tuple(u["column_names"]))
                for u in inspector.get_unique_constraints(table)
            ),
        }
        for table in sorted(inspector.get_table_names())
    }


def rows(engine: Engine, table: str, columns: list[str]) -> list[tuple[Any, ...]]:
    with engine.connect() as connection:
        result = connection.execute(
            text(f"SELECT {', '.join(columns)} FROM {table} ORDER BY {columns[0]}")
        )
        return [tuple(r) for r in result]


def test_open_when_the_release_before_migrations_wrote_it_then_rows_stay_and_schema_is_new(
    settings: Settings, clock: Clock, tmp_path: Path
) -> None:
    url = database.database_url(data_dir=settings.data_dir, url=settings.database_url)
    engine = database.make_engine(url=url)
    with engine.begin() as connection:
        for statement in release_schema(engine.dialect.name):
            connection.exec_driver_sql(statement)
        for table, row in ROWS:
            names = ", ".join(row)
            marks = ", ".join(f":{c}" for c in row)
            connection.execute(text(f"INSERT INTO {table} ({names}) VALUES ({marks})"), row)

    service = MarketService(settings, clock=clock)
    try:
        for table in {t for t, _ in ROWS}:
            written = [row for t, row in ROWS if t == table]
            columns = list(written[0])
            expected = sorted(tuple(row[c] for c in columns) for row in written)
            assert rows(engine, table, columns) == expected, table
        # Old fills are numbered in the order of (time, class, fill id); new ones follow.
        assert rows(engine, "fills", ["seq", "id"]) == [
            (1, "tpu-v5e:1"),
            (2, "tpu-v5e:2"),
            (3, "cpu:1"),
        ]
        fills = service.fills(device_class=None, limit=10)
        assert [f.id for f in fills] == ["cpu:1", "tpu-v5e:2", "tpu-v5e:1"]
        assert service.order(BID).owner == ALICE and service.order(ASK).state == "filled"
        assert service.deal("tpu-v5e:1").provider == BOB
        migrated = schema(engine)
    finally:
        service.close()
        engine.dispose()

    if settings.database_url is None:
        fresh_url = database.database_url(data_dir=tmp_path / "fresh", url=None)
    else:
        reset_postgres(settings.database_url)
        fresh_url = url
    fresh = database.make_engine(url=fresh_url)
    try:
        database.init_db(engine=fresh)
        assert migrated == schema(fresh)
        assert "seq" in migrated["fills"]["columns"] and "alembic_version" in migrated
    finally:
        fresh.dispose()


def test_init_db_when_run_again_then_nothing_changes(settings: Settings) -> None:
    url = database.database_url(data_dir=settings.data_dir, url=settings.database_url)
    engine = database.make_engine(url=url)
    try:
        database.init_db(engine=engine)
        first = schema(engine)
        database.init_db(engine=engine)
        assert schema(engine) == first
    finally:
        engine.dispose()
