"""The arbiter's crash-safe journal: cases, evidence received, rulings and their transactions.

SQLite (WAL, synchronous FULL) for the records; each piece of evidence a file written to a
temporary name, fsynced and renamed, its sha256 checked before the row that names it commits.
A ruling is journaled before its transaction is sent, and the transaction's hash after, so a
restart finds every case in one of: open, ruled (send or confirm it), done.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sqlite3
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

from contracts.evidence import Role
from contracts.messages import Receipt
from provider.arbiter.cases import ClaimedTask, Dispute

SCHEMA = """
CREATE TABLE IF NOT EXISTS cursor (id INTEGER PRIMARY KEY CHECK (id = 1), next_block INTEGER);
CREATE TABLE IF NOT EXISTS cases (
    deal INTEGER NOT NULL, batch INTEGER NOT NULL, client TEXT NOT NULL, provider TEXT NOT NULL,
    disputed_at INTEGER NOT NULL, deadline INTEGER NOT NULL, tasks TEXT NOT NULL,
    state TEXT NOT NULL, ruling TEXT, tx_hash TEXT, PRIMARY KEY (deal, batch)
);
CREATE TABLE IF NOT EXISTS evidence (
    deal INTEGER NOT NULL, batch INTEGER NOT NULL, task INTEGER NOT NULL, role INTEGER NOT NULL,
    sha256 TEXT NOT NULL, target TEXT, path TEXT NOT NULL,
    PRIMARY KEY (deal, batch, task, role)
);
"""


class CaseState(StrEnum):
    """Where a case stands: evidence being gathered, a ruling decided, or done on chain."""

    OPEN = "open"
    RULED = "ruled"
    DONE = "done"


@dataclass(frozen=True, slots=True)
class Case:
    """A dispute as the journal holds it."""

    dispute: Dispute
    state: CaseState
    ruling: dict[str, Any] | None
    tx_hash: str | None

    @property
    def key(self) -> tuple[int, int]:
        """The case's (deal, batch)."""
        return (self.dispute.deal_id, self.dispute.batch_id)


@dataclass(frozen=True, slots=True)
class Evidence:
    """One stored upload: its role, hash, compile target (program uploads) and file."""

    role: Role
    sha256: bytes
    target: str | None
    path: Path


class ArbiterJournal:
    """The journal in ``data_dir``: ``arbiter.sqlite3`` and ``evidence/``."""

    def __init__(self, data_dir: Path) -> None:
        """Open (or create) the journal; the data dir is made private to its owner."""
        data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.evidence_dir = data_dir / "evidence"
        self.evidence_dir.mkdir(exist_ok=True, mode=0o700)
        self._db = sqlite3.connect(
            data_dir / "arbiter.sqlite3", check_same_thread=False, isolation_level=None
        )
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")
        self._db.executescript(SCHEMA)
        self.lock = threading.RLock()

    def close(self) -> None:
        """Close the database."""
        with self.lock:
            self._db.close()

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        with self.lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield self._db
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")

    # ---- scanning --------------------------------------------------------------------

    def next_block(self, default: int) -> int:
        """Return the first block the next scan reads."""
        with self.lock:
            row = self._db.execute("SELECT next_block FROM cursor WHERE id = 1").fetchone()
        return default if row is None else int(row[0])

    def add_cases(self, disputes: list[Dispute], next_block: int) -> None:
        """Record new disputes and move the scan cursor, in one transaction."""
        with self._tx() as db:
            for d in disputes:
                db.execute(
                    "INSERT OR IGNORE INTO cases VALUES (?, ?, ?, ?, ?, ?, ?, ?, NULL, NULL)",
                    (
                        d.deal_id,
                        d.batch_id,
                        d.client,
                        d.provider,
                        d.disputed_at,
                        d.arbitration_deadline,
                        json.dumps([_task_json(t) for t in d.tasks]),
                        CaseState.OPEN,
                    ),
                )
            db.execute("INSERT OR REPLACE INTO cursor VALUES (1, ?)", (next_block,))

    # ---- cases -------------------------------------------------------------------------

    def case(self, deal_id: int, batch_id: int) -> Case | None:
        """Return one case, or None if this arbiter has not seen that dispute."""
        with self.lock:
            row = self._db.execute(
                "SELECT * FROM cases WHERE deal = ? AND batch = ?", (deal_id, batch_id)
            ).fetchone()
        return None if row is None else _case(row)

    def cases(self, *states: CaseState) -> list[Case]:
        """Return the cases in any of ``states``, oldest dispute first."""
        marks = ",".join("?" for _ in states)
        with self.lock:
            rows = self._db.execute(
                f"SELECT * FROM cases WHERE state IN ({marks}) ORDER BY disputed_at, deal, batch",
                [str(s) for s in states],
            ).fetchall()
        return [_case(r) for r in rows]

    def record_ruling(self, key: tuple[int, int], ruling: dict[str, Any]) -> None:
        """Journal a decided ruling before its transaction is sent."""
        with self._tx() as db:
            db.execute(
                "UPDATE cases SET state = ?, ruling = ? WHERE deal = ? AND batch = ?",
                (CaseState.RULED, json.dumps(ruling, sort_keys=True), *key),
            )

    def record_sent(self, key: tuple[int, int], tx_hash: str | None, *, done: bool) -> None:
        """Journal the ruling's transaction (or that the chain already holds an outcome)."""
        with self._tx() as db:
            db.execute(
                "UPDATE cases SET state = ?, tx_hash = COALESCE(?, tx_hash) "
                "WHERE deal = ? AND batch = ?",
                (CaseState.DONE if done else CaseState.RULED, tx_hash, *key),
            )

    # ---- evidence ----------------------------------------------------------------------

    def evidence_path(self, key: tuple[int, int], task: int, role: Role) -> Path:
        """Return where one upload is kept."""
        return self.evidence_dir / f"{key[0]}-{key[1]}-{task}-{int(role)}"

    def store_evidence(
        self,
        key: tuple[int, int],
        task: int,
        role: Role,
        temp: Path,
        sha256: bytes,
        target: str | None,
    ) -> None:
        """Move a fully written, hash-checked upload into place and record it (last one wins)."""
        path = self.evidence_path(key, task, role)
        with open(temp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(temp, path)
        _fsync_dir(self.evidence_dir)
        with self._tx() as db:
            db.execute(
                "INSERT OR REPLACE INTO evidence VALUES (?, ?, ?, ?, ?, ?, ?)",
                (*key, task, int(role), sha256.hex(), target, str(path)),
            )

    def evidence(self, key: tuple[int, int]) -> dict[tuple[int, Role], Evidence]:
        """Return every upload of a case by (task, role)."""
        with self.lock:
            rows = self._db.execute(
                "SELECT task, role, sha256, target, path FROM evidence "
                "WHERE deal = ? AND batch = ?",
                key,
            ).fetchall()
        return {
            (int(t), Role(r)): Evidence(Role(r), bytes.fromhex(h), g, Path(p))
            for t, r, h, g, p in rows
        }


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _task_json(task: ClaimedTask) -> dict[str, Any]:
    r = task.receipt
    fields = {
        f.name: (v.hex() if isinstance(v := getattr(r, f.name), bytes) else v)
        for f in dataclasses.fields(r)
    }
    return {"receipt": fields, "max_price": task.max_price}


def _task_from_json(data: dict[str, Any]) -> ClaimedTask:
    values: dict[str, Any] = {
        name: bytes.fromhex(value) if name in _BYTES_FIELDS else value
        for name, value in data["receipt"].items()
    }
    return ClaimedTask(receipt=Receipt(**values), max_price=int(data["max_price"]))


_BYTES_FIELDS = frozenset(f.name for f in dataclasses.fields(Receipt) if "bytes" in str(f.type))


def _case(row: tuple[Any, ...]) -> Case:
    deal, batch, client, provider, disputed_at, deadline, tasks, state, ruling, tx_hash = row
    dispute = Dispute(
        deal_id=int(deal),
        batch_id=int(batch),
        client=str(client),
        provider=str(provider),
        disputed_at=int(disputed_at),
        arbitration_deadline=int(deadline),
        tasks=tuple(_task_from_json(t) for t in json.loads(tasks)),
    )
    return Case(
        dispute=dispute,
        state=CaseState(state),
        ruling=None if ruling is None else json.loads(ruling),
        tx_hash=tx_hash,
    )
