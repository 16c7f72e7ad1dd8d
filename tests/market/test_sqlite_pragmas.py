"""The market's SQLite connections read the database file instead of mapping it: mapped pages of
a growing file counted in resident memory with every order stored (docs/benchmarks.md)."""

from __future__ import annotations

from pathlib import Path

from sqlalchemy import text

from market.database import make_engine


def test_every_connection_reads_the_file_unmapped_with_a_bounded_cache(tmp_path: Path) -> None:
    engine = make_engine(url=f"sqlite:///{tmp_path / 'market.sqlite3'}")
    try:
        with engine.connect() as first, engine.connect() as second:
            for connection in (first, second):
                assert connection.execute(text("PRAGMA mmap_size")).scalar() == 0
                assert connection.execute(text("PRAGMA cache_size")).scalar() == -65536
                assert connection.execute(text("PRAGMA journal_mode")).scalar() == "wal"
    finally:
        engine.dispose()
