"""Which device classes this market process is the single writer of, and how processes that
share one PostgreSQL database stay out of each other's way.

`Settings.device_classes` names the classes a process matches (comma-separated; empty: every
class, one process, as before). A process refuses orders and heartbeats of another class
(`WrongClassError`, 421, naming the classes it serves) and serves reads of every class in the
database: the book, fills, orders and deals are read from SQL, which every process writes.

What keeps several processes on one database correct (PostgreSQL only; a partitioned process
on SQLite is refused at start):

- **One writer per class.** At start a process takes a PostgreSQL session advisory lock per
  class it serves, and a shared lock that a process serving every class takes exclusively
  (`market serve` without classes): a second process claiming a class already served, or an
  all-classes process beside partitioned ones, is refused with `MarketConfigError`. The locks
  live with the process's connection: a crashed process's classes are free again at once.
  `market serve` on SQLite holds a lock file beside the database for the same purpose.
- **One fill order.** The global fill `seq` is numbered under a transaction advisory lock
  (`lock_fill_seq`) held until the group commits, so `seq` follows commit order across
  processes; fill ids (`<class>:<n>`) and order `seq` are per class, so one writer per class
  keeps them unique.
- **One balance.** A signer's commitments on the other processes' classes (live bids' unfilled
  spend, live and cancelled orders, unopened deals) are read from SQL under a per-signer
  advisory lock (`SharedFunds.hold`), held from the funds check until the request's orders are
  committed, so two processes cannot both spend one balance (`market.funds`).
- **One indexer.** Only the process holding the indexer lock indexes the chain; the others
  follow its index (the accounts its stored events moved are read again one run later) and
  keep a balance or stake for at most `funds_cache_s`; when the indexing process stops, the
  next run of another takes the lock and indexes from where the index stands
  (`market.follower`).
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import NamedTuple

from sqlalchemy import create_engine
from sqlalchemy.engine import Connection, Engine

from market.database import SQLITE_FILE
from market.errors import MarketConfigError, WrongClassError
from market.settings import Settings

log = logging.getLogger(__name__)

NAMESPACE = 26_001
"""The first key of every advisory lock the market takes (the second hashes a name within the
connection's schema, so markets in other schemas of one database never collide)."""

_KEY = f"{NAMESPACE}, hashtext(current_schema() || ':' || %s)"
ALL = "*"
FUNDS_POOL = 16
"""Connections kept for funds holds (one per request being checked or committed)."""


def classes_of(settings: Settings) -> frozenset[str] | None:
    """Return the device classes the settings name, or None (every class)."""
    names = frozenset(part.strip() for part in settings.device_classes.split(",") if part.strip())
    return names or None


class Partition:
    """The classes one process serves (None: all) and the locks that make it their writer."""

    def __init__(self, classes: frozenset[str] | None) -> None:
        """Serve `classes` (None: every class); claim nothing yet."""
        self.classes = classes
        self.indexes = True  # whether this process runs the chain indexer
        self.funds: SharedFunds | None = None
        self._claim: Connection | None = None
        self._file: int | None = None

    @property
    def shared(self) -> bool:
        """Return whether other processes may write the same database (classes are named)."""
        return self.classes is not None

    def owns(self, device_class: str) -> bool:
        """Return whether this process matches `device_class`."""
        return self.classes is None or device_class in self.classes

    def refuse(self, device_classes: Iterable[str]) -> None:
        """Raise `WrongClassError` for the first of `device_classes` this process does not serve."""
        if self.classes is None:
            return
        for name in device_classes:
            if name not in self.classes:
                served = ", ".join(sorted(self.classes))
                raise WrongClassError(
                    f"device class {name!r} is matched by another market process; this one "
                    f"serves {served}"
                )

    def claim(self, db: Engine) -> None:
        """Become the single writer of this process's classes in `db`; raise
        `MarketConfigError` if another process is (see the module)."""
        if db.dialect.name != "postgresql":
            if self.shared:
                raise MarketConfigError(
                    "market setting device_classes (TPUMARKET_MARKET_DEVICE_CLASSES): several "
                    "processes on one database need PostgreSQL; SQLite serves every class in "
                    "one process"
                )
            return
        connection = db.connect().execution_options(isolation_level="AUTOCOMMIT")
        try:
            if self.classes is None:
                taken = [] if _try(connection, ALL) else ["every class"]
            else:
                taken = [] if _try(connection, ALL, shared=True) else ["every class"]
                taken += [n for n in sorted(self.classes) if not _try(connection, "class:" + n)]
                self.indexes = _try(connection, "indexer")
                self.funds = SharedFunds(db, self.classes)
        except BaseException:
            _close(connection)
            raise
        if taken:
            _close(connection)
            raise MarketConfigError(
                f"another market process on this database is the writer of {', '.join(taken)}"
            )
        self._claim = connection

    def try_index(self) -> bool:
        """Take the indexer lock if no process holds it (its holder stopped); return whether
        this process indexes now (`market.follower`)."""
        if self.indexes:
            return True
        if self._claim is not None:
            try:
                self.indexes = _try(self._claim, "indexer")
            except Exception:  # the database is unreachable: try again at the next run
                log.warning("indexer lock: the database did not answer", exc_info=True)
        return self.indexes

    def claim_file(self, data_dir: Path) -> None:
        """Hold the lock file of a SQLite database in `data_dir` for this process's life; raise
        `MarketConfigError` if another process holds it."""
        data_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(data_dir / (SQLITE_FILE + ".writer"), os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise MarketConfigError(
                f"another market process serves the SQLite database in {data_dir}"
            ) from None
        self._file = fd

    def release(self) -> None:
        """Give up the claim (the locks go with the connection)."""
        if self.funds is not None:
            self.funds.close()
        connection, self._claim = self._claim, None
        if connection is not None:
            _close(connection)
        fd, self._file = self._file, None
        if fd is not None:
            os.close(fd)


def _close(connection: Connection) -> None:
    """Close `connection` for good, not back into the pool: its session's locks end with it."""
    with contextlib.suppress(Exception):
        connection.invalidate()
    with contextlib.suppress(Exception):
        connection.close()


def _try(connection: Connection, name: str, *, shared: bool = False) -> bool:
    function = "pg_try_advisory_lock_shared" if shared else "pg_try_advisory_lock"
    return bool(connection.exec_driver_sql(f"SELECT {function}({_KEY})", (name,)).scalar())


def lock_fill_seq(connection: Connection) -> None:
    """Hold, until `connection`'s transaction ends, the lock that numbers fills: the next
    `MAX(seq)` read sees every fill committed before (PostgreSQL; see the module)."""
    connection.exec_driver_sql(f"SELECT pg_advisory_xact_lock({_KEY})", ("fills",))


class Others(NamedTuple):
    """What a signer holds in the classes of other processes (from SQL)."""

    live: int
    bid_spend: int
    deal_spend: int
    cancelled: int


_OTHERS = """
SELECT
 (SELECT COUNT(*) FROM orders WHERE owner = %(owner)s AND state IN ('open', 'partially_filled')
   AND NOT (device_class = ANY(%(mine)s))),
 (SELECT COALESCE(SUM(price::numeric * remaining), 0) FROM orders WHERE owner = %(owner)s
   AND side = 'bid' AND state IN ('open', 'partially_filled')
   AND NOT (device_class = ANY(%(mine)s))),
 (SELECT COALESCE(SUM(price::numeric * quantity), 0) FROM deals WHERE client = %(owner)s
   AND chain_deal_id IS NULL AND created_at >= %(since)s AND NOT (device_class = ANY(%(mine)s))),
 (SELECT COUNT(*) FROM orders WHERE owner = %(owner)s AND state = 'cancelled'
   AND expiry > %(now)s AND NOT (device_class = ANY(%(mine)s)))
"""


_DEALS = """
SELECT COALESCE(SUM(price::numeric * quantity), 0) FROM deals WHERE client = %(owner)s
  AND chain_deal_id IS NULL AND created_at >= %(since)s AND NOT (device_class = ANY(%(mine)s))
"""


class FundsHold:
    """Per-signer locks held on one connection from a funds check until its orders are
    committed (or refused); reads what the signers hold in other processes' classes."""

    def __init__(self, funds: SharedFunds, owners: Sequence[str]) -> None:
        """Take the locks of `owners`, in sorted order (no two holds wait on each other)."""
        self._funds = funds
        self._connection: Connection | None = funds.engine.connect()
        try:
            for owner in sorted(set(owners)):
                self._connection.exec_driver_sql(
                    f"SELECT pg_advisory_lock({_KEY})", ("funds:" + owner,)
                )
        except BaseException:
            self._drop()
            raise

    def others(self, owner: str, now: float, hold_s: float) -> Others:
        """Return what `owner` holds in the classes this process does not serve, at `now`."""
        assert self._connection is not None
        return self._funds.others(self._connection, owner, now, hold_s)

    def release(self) -> None:
        """Let the locks go (the committed orders are now in SQL for the other processes)."""
        connection = self._connection
        if connection is None:
            return
        try:
            connection.exec_driver_sql("SELECT pg_advisory_unlock_all()")
        except BaseException:
            self._drop()
            raise
        self._connection = None
        connection.close()

    def _drop(self) -> None:
        """Close the connection for good: its locks end with its session."""
        connection, self._connection = self._connection, None
        if connection is not None:
            _close(connection)


class SharedFunds:
    """The funds check's view of the other processes' commitments (see the module)."""

    def __init__(self, db: Engine, classes: frozenset[str]) -> None:
        """Read `db` with a pool of its own; `classes` are this process's."""
        self.mine = sorted(classes)
        self.engine = create_engine(
            db.url,
            pool_size=FUNDS_POOL,
            max_overflow=2 * FUNDS_POOL,
            isolation_level="AUTOCOMMIT",  # no ping per checkout: one round trip less a request
        )

    def hold(self, owners: Sequence[str]) -> FundsHold:
        """Lock `owners`' funds across processes until the hold is released."""
        return FundsHold(self, owners)

    def others(self, connection: Connection, owner: str, now: float, hold_s: float) -> Others:
        """Return what `owner` holds in other processes' classes (one query)."""
        row = connection.exec_driver_sql(
            _OTHERS, {"owner": owner, "mine": self.mine, "since": now - hold_s, "now": int(now)}
        ).one()
        return Others(int(row[0]), int(row[1]), int(row[2]), int(row[3]))

    def unopened_spend(self, owner: str, now: float, hold_s: float) -> int:
        """Return the spend of `owner`'s unopened deals in other processes' classes."""
        with self.engine.connect() as connection:
            spend = connection.exec_driver_sql(
                _DEALS, {"owner": owner, "mine": self.mine, "since": now - hold_s}
            ).scalar()
        return int(spend or 0)

    def close(self) -> None:
        """Close the pool."""
        self.engine.dispose()
