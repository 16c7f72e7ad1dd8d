"""SQLite's log starts over while the market writes, and the writer's commits do not checkpoint.

A checkpoint by the background thread (`market.checkpoint`) cannot copy what the writer commits
while it runs, nor what a reader's snapshot still needs; only a checkpoint on the writer's own
connection between its groups can finish the job, after which its next commit starts the log
over (the log's header then carries a checkpoint sequence number one higher).
"""

from __future__ import annotations

import contextlib
import sqlite3
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import event

from market.checkpoint import Checkpointer
from market.database import SQLITE_FILE, make_engine
from market.service import MarketService
from market.writer import WRITER_AUTOCHECKPOINT_PAGES

from .conftest import START
from .signing import Trader


@pytest.fixture
def backend() -> None:
    """SQLite only: PostgreSQL has no log of this kind to checkpoint."""
    return None


def log_sequence(data_dir: Path) -> int:
    """Return the checkpoint sequence number in the log's header (bytes 12-15, big-endian):
    SQLite raises it each time the log starts over."""
    header = (data_dir / f"{SQLITE_FILE}-wal").read_bytes()[:32]
    return int.from_bytes(header[12:16], "big")


@contextlib.contextmanager
def statements_by_thread(service: MarketService) -> Iterator[list[tuple[str, str]]]:
    """Yield a list that fills with (thread name, statement) of every statement run."""
    seen: list[tuple[str, str]] = []

    def record(_conn: Any, _cursor: Any, statement: str, *_rest: Any) -> None:
        seen.append((threading.current_thread().name, statement))

    event.listen(service.db, "before_cursor_execute", record)
    try:
        yield seen
    finally:
        event.remove(service.db, "before_cursor_execute", record)


@pytest.fixture
def quiet(service: MarketService) -> MarketService:
    """The service with its background checkpoints stopped: the test runs them by hand."""
    assert service.checkpointer is not None
    service.checkpointer.close()
    service.writer.call(lambda: None)  # then a checkpoint the last background one asked for
    return service


def place(client: TestClient, trader: Trader, price: int) -> None:
    client.post("/v1/orders", json=trader.bid(START, price=price)).raise_for_status()


def test_the_log_starts_over_after_a_checkpoint_that_could_not_copy_everything(
    quiet: MarketService, client: TestClient, alice: Trader
) -> None:
    data_dir = quiet.settings.data_dir
    place(client, alice, 10)
    before = log_sequence(data_dir)
    reader = sqlite3.connect(data_dir / SQLITE_FILE, isolation_level=None)
    try:
        reader.execute("BEGIN")
        reader.execute("SELECT COUNT(*) FROM orders").fetchall()  # a snapshot at this commit
        place(client, alice, 11)  # beyond the reader's snapshot: the checkpoint cannot copy it
        assert quiet.checkpointer is not None
        quiet.checkpointer.checkpoint()  # copies up to the snapshot; asks the writer for more
    finally:
        reader.execute("COMMIT")
        reader.close()
    place(client, alice, 12)  # answered, then the writer checkpoints what is left
    assert log_sequence(data_dir) == before  # not yet over: the checkpoint follows this commit
    place(client, alice, 13)  # the first commit after it starts the log over
    assert log_sequence(data_dir) == before + 1


def test_the_writer_checkpoints_only_when_asked_and_never_inside_its_commits(
    quiet: MarketService, client: TestClient, alice: Trader
) -> None:
    quiet.writer.call(quiet.writer._disconnect)  # its next group opens a connection again
    with statements_by_thread(quiet) as seen:
        place(client, alice, 20)
        place(client, alice, 21)
        quiet.writer.call(lambda: None)
        writer = [s for thread, s in seen if thread == "market-writer"]
        assert f"PRAGMA wal_autocheckpoint={WRITER_AUTOCHECKPOINT_PAGES}" in writer
        assert not [s for s in writer if "wal_checkpoint" in s]  # not asked: none
        seen.clear()
        quiet.writer.checkpoint_soon()
        place(client, alice, 22)
        quiet.writer.call(lambda: None)  # the writer has finished with the group
        writer = [s for thread, s in seen if thread == "market-writer"]
        assert writer[-1] == "PRAGMA wal_checkpoint(PASSIVE)"  # after the group's writes
        assert any(s.startswith("INSERT INTO orders") for s in writer[:-1])
        seen.clear()
        place(client, alice, 23)  # asked once, done once
        quiet.writer.call(lambda: None)
        assert not [s for thread, s in seen if "wal_checkpoint" in s]


def test_the_background_checkpoint_tells_whoever_asked_after_each_checkpoint(
    tmp_path: Path,
) -> None:
    engine = make_engine(url=f"sqlite:///{tmp_path / SQLITE_FILE}")
    told: list[int] = []
    checkpointer = Checkpointer(
        engine, lambda: 0, every_s=3600, on_checkpoint=lambda: told.append(1)
    )
    try:
        with engine.begin() as connection:
            connection.exec_driver_sql("CREATE TABLE t (x INTEGER)")
        checkpointer.checkpoint()
        checkpointer.checkpoint()
        assert told == [1, 1]
    finally:
        checkpointer.close()
        engine.dispose()
