"""Fixtures of the market service tests: both SQL backends, a settable clock, an API client."""

from __future__ import annotations

import atexit
import contextlib
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import create_engine, text
from sqlalchemy.exc import SQLAlchemyError

from market.api.app import create_app
from market.database import database_url
from market.service import MarketService
from market.settings import Settings
from tests import processes, workers

from .signing import CHAIN_ID, ESCROW, Trader

ROOT = Path(__file__).resolve().parents[2]
START = 1_900_000_000


class Clock:
    """A market clock that tests move by hand."""

    def __init__(self, now: float = START) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


_pg: dict[str, str | None] = {}


def postgres_url() -> tuple[str | None, str]:
    """Return (url, why-not): TEST_DATABASE_URL, else what scripts/postgres-up prints."""
    if "url" not in _pg:
        url = os.environ.get("TEST_DATABASE_URL")
        reason = ""
        if not url:
            try:
                with workers.host_lock("postgres-up"):  # one initdb, one start, by one worker
                    done = subprocess.run(
                        [str(ROOT / "scripts" / "postgres-up")],
                        capture_output=True,
                        text=True,
                        timeout=300,
                        check=False,
                        env=processes.unmarked_env(),  # the cluster outlives the run, by design
                    )
                lines = done.stdout.strip().splitlines()
                if done.returncode == 0 and lines:
                    url = lines[-1]
                else:
                    reason = f"scripts/postgres-up failed ({done.returncode}): {done.stderr[-500:]}"
            except (OSError, subprocess.TimeoutExpired) as exc:
                reason = f"scripts/postgres-up could not run: {exc}"
        if url:  # this process's own schema: parallel workers share the database
            url = workers.postgres_url_for_schema(url)
            atexit.register(_drop_schema, url)
        _pg["url"] = url
        _pg["reason"] = reason
    return _pg["url"], _pg["reason"] or ""


def reset_postgres(url: str) -> None:
    """Drop everything in this process's schema of the PostgreSQL database at `url`."""
    engine = create_engine(database_url(data_dir=Path("."), url=url))
    with engine.begin() as conn:
        conn.execute(text(f"DROP SCHEMA IF EXISTS {workers.POSTGRES_SCHEMA} CASCADE"))
        conn.execute(text(f"CREATE SCHEMA {workers.POSTGRES_SCHEMA}"))
    engine.dispose()


def _drop_schema(url: str) -> None:
    """Drop this process's schema at exit (a cluster that is gone by then has nothing to drop)."""
    engine = create_engine(database_url(data_dir=Path("."), url=url))
    with contextlib.suppress(SQLAlchemyError), engine.begin() as conn:
        conn.execute(text(f"DROP SCHEMA IF EXISTS {workers.POSTGRES_SCHEMA} CASCADE"))
    engine.dispose()


@pytest.fixture(params=["sqlite", "postgresql"])
def backend(request: pytest.FixtureRequest) -> str | None:
    """Return the DATABASE_URL of a clean database (None for SQLite in the test's data dir)."""
    if request.param == "sqlite":
        return None
    processes.refuse_component("PostgreSQL")  # the fast set's guard (tests/conftest.py)
    url, reason = postgres_url()
    if url is None:
        print(f"PostgreSQL tests skipped: {reason}")
        pytest.skip(f"PostgreSQL unavailable: {reason}")
    reset_postgres(url)
    return url


@pytest.fixture
def pg() -> str:
    """A clean PostgreSQL schema's URL (the market tests' own cluster)."""
    processes.refuse_component("PostgreSQL")
    url, reason = postgres_url()
    if url is None:
        pytest.skip(f"PostgreSQL unavailable: {reason}")
    reset_postgres(url)
    return url


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def settings(tmp_path: Path, backend: str | None) -> Settings:
    return Settings(
        data_dir=tmp_path / "data",
        database_url=backend,
        chain_id=CHAIN_ID,
        escrow=ESCROW,
        run_jobs=False,
    )


@pytest.fixture
def service(settings: Settings, clock: Clock) -> Iterator[MarketService]:
    svc = MarketService(settings, clock=clock)
    yield svc
    svc.close()


@pytest.fixture
def client(service: MarketService) -> Iterator[TestClient]:
    with TestClient(create_app(service=service)) as test_client:
        yield test_client


@pytest.fixture
def alice() -> Trader:
    """A client (bids)."""
    return Trader()


@pytest.fixture
def bob() -> Trader:
    """A provider (asks)."""
    return Trader()
