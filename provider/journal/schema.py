"""The journal's tables, triggers and migrations (``PRAGMA user_version``).

1. (unversioned) acks, receipts, vouchers, settlements, blobs: settlement protocol v1.
2. protocol v2: ``acks.protocol`` (1 for rows written before), ``quotes`` (per-fill quotes
   signed for the market's deals), ``meta`` (cursors of the chain scans).
3. sealing: ``deals`` (every deal the journal holds a row of, filled by triggers in the
   row's own transaction), ``seals`` (the signed checkpoint of each closed and settled deal;
   triggers refuse any row for a sealed deal), indexes on the deal of every table, so opening
   reads only the deals still open.
4. retention: ``task_data`` (each task's envelope frame and delivered outputs, out of the
   sealed rows: the ack's ``envelope`` and the receipt's ``outputs`` columns stay empty for new
   rows), ``pruned`` (append-only: each task whose data was dropped once nothing could still
   need it, :mod:`provider.journal.retention`); ``blobs`` rows may be deleted (a program or
   weights no unpruned ack refers to).
"""

from __future__ import annotations

import logging
import sqlite3
from pathlib import Path

from provider.errors import JournalError

log = logging.getLogger("provider.journal")

SCHEMA_VERSION = 4
"""The journal's schema version; older journals migrate on open (see the module docstring)."""

SEALED = "the deal is sealed"
"""The abort message of a row refused because its deal is sealed."""

_DEAL_TABLES = ("acks", "receipts", "vouchers", "settlements")
_TABLES = (*_DEAL_TABLES, "blobs", "quotes", "deals", "seals", "pruned")
_SCHEMA = """
CREATE TABLE IF NOT EXISTS blobs (
    sha256 BLOB PRIMARY KEY,
    data BLOB NOT NULL
);
CREATE TABLE IF NOT EXISTS acks (
    deal_id TEXT NOT NULL,
    task_index INTEGER NOT NULL,
    request_json TEXT NOT NULL,
    request_sig BLOB NOT NULL,
    request_hash BLOB NOT NULL,
    target TEXT,
    envelope BLOB NOT NULL,
    ack_json TEXT NOT NULL,
    ack_sig BLOB NOT NULL,
    acked_at REAL NOT NULL,
    program_sha256 BLOB,
    weights_sha256 BLOB,
    protocol INTEGER NOT NULL DEFAULT 1,
    PRIMARY KEY (deal_id, task_index)
);
CREATE TABLE IF NOT EXISTS receipts (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    deal_id TEXT NOT NULL,
    task_index INTEGER NOT NULL,
    receipt_json TEXT NOT NULL,
    receipt_sig BLOB NOT NULL,
    receipt_hash BLOB NOT NULL,
    outputs BLOB NOT NULL,
    detail_json TEXT NOT NULL,
    recorded_at REAL NOT NULL,
    UNIQUE (deal_id, task_index)
);
CREATE TABLE IF NOT EXISTS vouchers (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    deal_id TEXT NOT NULL,
    voucher_json TEXT NOT NULL,
    signature BLOB NOT NULL,
    received_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS settlements (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    deal_id TEXT NOT NULL,
    action TEXT NOT NULL,
    data_json TEXT NOT NULL,
    tx_hash TEXT,
    recorded_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS quotes (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    market_deal_id TEXT NOT NULL,
    quote_json TEXT NOT NULL,
    signature BLOB NOT NULL,
    signed_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS meta (
    key TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS deals (
    deal_id TEXT PRIMARY KEY
);
CREATE TABLE IF NOT EXISTS seals (
    deal_id TEXT PRIMARY KEY,
    checkpoint_json TEXT NOT NULL,
    signature BLOB NOT NULL,
    sealed_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS task_data (
    deal_id TEXT NOT NULL,
    task_index INTEGER NOT NULL,
    part TEXT NOT NULL CHECK (part IN ('frame', 'outputs')),
    data BLOB NOT NULL,
    charged INTEGER NOT NULL,
    PRIMARY KEY (deal_id, task_index, part)
);
CREATE TABLE IF NOT EXISTS pruned (
    deal_id TEXT NOT NULL,
    task_index INTEGER NOT NULL,
    reason TEXT NOT NULL,
    charged INTEGER NOT NULL,
    pruned_at REAL NOT NULL,
    PRIMARY KEY (deal_id, task_index)
);
CREATE INDEX IF NOT EXISTS acks_by_program ON acks (program_sha256);
CREATE INDEX IF NOT EXISTS acks_by_weights ON acks (weights_sha256);
CREATE INDEX IF NOT EXISTS receipts_by_deal ON receipts (deal_id, seq);
CREATE INDEX IF NOT EXISTS vouchers_by_deal ON vouchers (deal_id, seq);
CREATE INDEX IF NOT EXISTS settlements_by_deal ON settlements (deal_id, seq);
CREATE INDEX IF NOT EXISTS quotes_by_deal ON quotes (market_deal_id, seq);
"""


def _triggers() -> str:
    append_only = "".join(
        f"CREATE TRIGGER IF NOT EXISTS {t}_no_{op} BEFORE {op.upper()} ON {t} "
        f"BEGIN SELECT RAISE(ABORT, 'the journal is append-only'); END;\n"
        for t in _TABLES
        for op in ("update", "delete")
        if (t, op) != ("blobs", "delete")  # unreferenced blobs go (provider.journal.retention)
    )
    per_deal = "".join(
        f"CREATE TRIGGER IF NOT EXISTS {t}_sealed BEFORE INSERT ON {t} "
        f"WHEN EXISTS (SELECT 1 FROM seals WHERE deal_id = NEW.deal_id) "
        f"BEGIN SELECT RAISE(ABORT, '{SEALED}'); END;\n"
        f"CREATE TRIGGER IF NOT EXISTS {t}_deal AFTER INSERT ON {t} "
        f"BEGIN INSERT OR IGNORE INTO deals (deal_id) VALUES (NEW.deal_id); END;\n"
        for t in _DEAL_TABLES
    )
    return append_only + per_deal


def _has_table(db: sqlite3.Connection, name: str) -> bool:
    row = db.execute(
        "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (name,)
    ).fetchone()
    return row is not None


def migrate(db: sqlite3.Connection, path: Path) -> int | None:
    """Create or migrate the schema to :data:`SCHEMA_VERSION`; return the version migrated
    from (None when the journal was current or new). One transaction: all or nothing."""
    version = int(db.execute("PRAGMA user_version").fetchone()[0])
    if version > SCHEMA_VERSION:
        raise JournalError(
            f"the journal at {path} has schema version {version}; this daemon knows "
            f"up to {SCHEMA_VERSION} (a newer daemon wrote it)"
        )
    existed = _has_table(db, "acks")
    if existed and version == SCHEMA_VERSION:
        return None
    columns = {row[1] for row in db.execute("PRAGMA table_info(acks)")}
    steps = []
    if existed:
        for column in ("program_sha256", "weights_sha256"):
            if column not in columns:  # written before blobs were shared
                steps.append(f"ALTER TABLE acks ADD COLUMN {column} BLOB;")
        if "protocol" not in columns:  # written under settlement protocol v1
            steps.append("ALTER TABLE acks ADD COLUMN protocol INTEGER NOT NULL DEFAULT 1;")
    backfill = ""
    if existed and not _has_table(db, "deals"):  # before v3: every deal any row names
        backfill = "".join(
            f"INSERT OR IGNORE INTO deals (deal_id) SELECT DISTINCT deal_id FROM {t};\n"
            for t in _DEAL_TABLES
        )
    script = (
        "BEGIN IMMEDIATE;\n"
        + "\n".join(steps)
        + _SCHEMA
        + "DROP TRIGGER IF EXISTS blobs_no_delete;\n"
        + _triggers()
        + backfill
        + f"PRAGMA user_version = {SCHEMA_VERSION};\nCOMMIT;"
    )
    try:
        db.executescript(script)
    except BaseException:
        if db.in_transaction:
            db.execute("ROLLBACK")
        raise
    if not existed:
        return None
    log.warning(
        "journal migrated",
        extra={"path": str(path), "from_version": version or 1, "to": SCHEMA_VERSION},
    )
    return version or 1
