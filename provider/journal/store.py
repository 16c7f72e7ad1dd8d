"""The crash-safe journal: acks, chained receipts with results, vouchers, settlements.

SQLite in WAL mode with ``synchronous=NORMAL``: every commit is in the OS before the call
returns, so a ``kill -9`` of the daemon loses nothing it answered (an ack may be deferred to
commit with its receipt, but never leaves the process uncommitted: see
:meth:`Journal.record_ack`) (power loss may lose the last
transactions; set ``synchronous=FULL`` through ``durable=True`` for that). Tables are
append-only, enforced by triggers: state changes are new rows (a redeemed voucher, a claimed
batch, a finalized batch), never updates; only ``meta`` (cursors of chain scans) is updated.

An ack keeps the envelope it answers, so an acked task can be re-run after a crash; program
and weights sections are stored once per content hash (table ``blobs``), the rest of the
envelope (header and inputs) in the ack's row: a model's weights are journaled once, not once
per task.

Receipts chain per deal: each receipt's ``prevReceiptHash`` is the EIP-712 struct hash of the
deal's previous receipt (zero for the first). :meth:`Journal.verify` walks every chain, checks
each link, hash and signature, and runs on every open.

The schema is versioned (``PRAGMA user_version``, :data:`SCHEMA_VERSION`); an older journal is
migrated in one transaction when opened. Rows acked under settlement protocol v1 stay
readable (their receipts verify under the escrow domain of version ``1``), but they cannot be
claimed under v2: their request signatures carry no deadline (a warning names such deals).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import sqlite3
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, cast

from contracts.errors import SignatureError
from contracts.messages import (
    ZERO_HASH,
    Ack,
    Domain,
    Quote,
    Receipt,
    TaskRequest,
    Voucher,
    recover_digest,
)
from contracts.program import ProgramFormatError, join_envelope, split_envelope
from provider.errors import JournalCorruptError, JournalError

Key = tuple[int, int]
log = logging.getLogger("provider.journal")

SCHEMA_VERSION = 2
"""The journal's schema version (``PRAGMA user_version``); older journals migrate on open.

1. (unversioned) acks, receipts, vouchers, settlements, blobs: settlement protocol v1.
2. protocol v2: ``acks.protocol`` (1 for rows written before), ``quotes`` (per-fill quotes
   signed for the market's deals), ``meta`` (cursors of the chain scans).
"""
PROTOCOL = 2
"""The settlement protocol of the acks this daemon writes (the escrow's domain version)."""

_TABLES = ("acks", "receipts", "vouchers", "settlements", "blobs", "quotes")
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
"""


def _append_only_triggers() -> str:
    return "".join(
        f"CREATE TRIGGER IF NOT EXISTS {t}_no_{op} BEFORE {op.upper()} ON {t} "
        f"BEGIN SELECT RAISE(ABORT, 'the journal is append-only'); END;\n"
        for t in _TABLES
        for op in ("update", "delete")
    )


@dataclass(frozen=True, slots=True)
class AckRecord:
    """A task the daemon accepted: the client's signed request and our signed ack.

    ``protocol`` is the settlement protocol it was acked under. A protocol-1 ack (a journal
    written before v2) signed an ack with its own deadline, and its request signature has no
    deadline: ``request`` carries the ack's deadline so receipts check, ``legacy_ack`` the ack
    as signed, and the task cannot be claimed under v2 (:attr:`claimable`).
    """

    request: TaskRequest
    request_sig: bytes
    request_hash: bytes
    target: str | None
    ack: Ack
    ack_sig: bytes
    acked_at: float
    protocol: int = PROTOCOL
    legacy_ack: dict[str, Any] | None = None

    @property
    def key(self) -> Key:
        """Return (deal id, task index)."""
        return (self.ack.deal_id, self.ack.task_index)

    @property
    def claimable(self) -> bool:
        """Return whether the client's request signature can carry a claim on this escrow."""
        return self.protocol >= 2

    def ack_json(self) -> dict[str, Any]:
        """Return the ack as it was signed (its legacy form for a protocol-1 ack)."""
        return self.legacy_ack if self.legacy_ack is not None else self.ack.to_json()


@dataclass(frozen=True, slots=True)
class ReceiptRecord:
    """A delivered task: the signed receipt, its hash and what the client gets besides."""

    receipt: Receipt
    signature: bytes
    receipt_hash: bytes
    detail: dict[str, Any]
    seq: int

    @property
    def key(self) -> Key:
        """Return (deal id, task index)."""
        return (self.receipt.deal_id, self.receipt.task_index)

    @property
    def on_time(self) -> bool:
        """Return whether the task finished by its deadline (only then can it be claimed)."""
        return self.receipt.finished_at <= self.receipt.deadline


@dataclass(frozen=True, slots=True)
class VoucherRecord:
    """A client-signed cumulative voucher as received."""

    voucher: Voucher
    signature: bytes
    received_at: float
    seq: int


@dataclass(frozen=True, slots=True)
class SettlementRecord:
    """A settlement step of a deal.

    Actions: ``opened`` (the deal seen on chain, with its terms), ``redeem``, ``claim``,
    ``finalize``, ``rejected`` (a claim the arbiter or a lapse gave to the client),
    ``refunded`` (tasks the client refunded), ``missed`` (tasks whose settlement instant
    passed off chain), ``voucher_unusable`` (a voucher the escrow refused to redeem),
    ``closed``.
    """

    deal_id: int
    action: str
    data: dict[str, Any]
    tx_hash: str | None
    recorded_at: float
    seq: int


@dataclass(frozen=True, slots=True)
class QuoteRecord:
    """A per-fill quote this daemon signed for a market deal."""

    market_deal_id: str
    quote: Quote
    signature: bytes
    signed_at: float
    seq: int


@dataclass
class DealBook:
    """What the journal knows of one deal, kept in memory for the hot path.

    ``claiming`` holds the tasks of a claim transaction in flight (not journaled yet): a
    voucher covering one of them is refused like one covering a claimed task.
    """

    acks: dict[int, AckRecord]
    receipts: dict[int, ReceiptRecord]
    vouchers: list[VoucherRecord]
    settlements: list[SettlementRecord]
    last_receipt_hash: bytes = ZERO_HASH
    ack_total: int = 0
    settled_ack_total: int | None = None
    claiming: set[int] = field(default_factory=set)
    _derived: dict[str, Any] = field(default_factory=dict)

    def _tasks_of(self, action: str) -> frozenset[int]:
        cached = self._derived.get(action)
        if cached is None:
            cached = self._derived[action] = frozenset(
                int(i) for s in self.settlements if s.action == action for i in s.data["tasks"]
            )
        return cast(frozenset[int], cached)

    def unusable_vouchers(self) -> frozenset[int]:
        """Return the seqs of vouchers the escrow refused to redeem."""
        cached = self._derived.get("unusable")
        if cached is None:
            cached = self._derived["unusable"] = frozenset(
                int(s.data["voucher_seq"])
                for s in self.settlements
                if s.action == "voucher_unusable"
            )
        return cast(frozenset[int], cached)

    @property
    def latest_voucher(self) -> VoucherRecord | None:
        """Return the latest acceptable voucher (the escrow did not refuse it), if any."""
        unusable = self.unusable_vouchers()
        for record in reversed(self.vouchers):
            if record.seq not in unusable:
                return record
        return None

    def redeemed(self) -> VoucherRecord | None:
        """Return the last voucher redeemed on chain, if any."""
        if "redeemed" not in self._derived:
            found = None
            for settlement in reversed(self.settlements):
                if settlement.action == "redeem":
                    seq = int(settlement.data["voucher_seq"])
                    found = next(v for v in self.vouchers if v.seq == seq)
                    break
            self._derived["redeemed"] = found
        return cast(VoucherRecord | None, self._derived["redeemed"])

    def claimed_tasks(self) -> frozenset[int]:
        """Return the task indices claimed on chain."""
        return self._tasks_of("claim")

    def refunded_tasks(self) -> frozenset[int]:
        """Return the task indices the client refunded on chain."""
        return self._tasks_of("refunded")

    def missed_tasks(self) -> frozenset[int]:
        """Return the task indices whose settlement instant passed while not on chain."""
        return self._tasks_of("missed")

    def on_chain(self, index: int) -> bool:
        """Return whether a task is settled on chain: vouched (redeemed), claimed or refunded."""
        if index in self.claimed_tasks() or index in self.refunded_tasks():
            return True
        redeemed = self.redeemed()
        return redeemed is not None and redeemed.voucher.covers(index)

    def opened(self) -> dict[str, Any] | None:
        """Return the deal's terms as seen on chain (``opened`` row), if journaled."""
        for settlement in self.settlements:
            if settlement.action == "opened":
                return settlement.data
        return None

    def closed(self) -> bool:
        """Return whether a settlement job saw the deal closed on chain."""
        return any(s.action == "closed" for s in self.settlements)

    def unpaid_ack_total(self) -> int:
        """Return the ack prices of accepted tasks the chain has not settled yet.

        A task paid by a redeemed voucher or a claim is in the deal's ``committed`` or
        ``pending``; a refunded one is in ``committed`` too: none of them counts here again.
        """
        if self.settled_ack_total is None:
            self.settled_ack_total = sum(
                record.ack.price for index, record in self.acks.items() if self.on_chain(index)
            )
        return self.ack_total - self.settled_ack_total

    def changed(self) -> None:
        """Forget what was derived from the settlements (a row was appended)."""
        self._derived.clear()
        self.settled_ack_total = None


def _now() -> float:
    return time.time()


def _ack_record(
    request: dict[str, Any],
    request_sig: bytes,
    request_hash: bytes,
    target: str | None,
    ack: dict[str, Any],
    ack_sig: bytes,
    acked_at: float,
    protocol: int,
) -> AckRecord:
    """Return an ack row as a record; a protocol-1 row takes its deadline from its ack."""
    if protocol >= PROTOCOL:
        return AckRecord(
            request=TaskRequest.from_json(request),
            request_sig=request_sig,
            request_hash=request_hash,
            target=target,
            ack=Ack.from_json(ack),
            ack_sig=ack_sig,
            acked_at=acked_at,
        )
    return AckRecord(
        request=TaskRequest.from_json({**request, "deadline": ack["deadline"]}),
        request_sig=request_sig,
        request_hash=request_hash,
        target=target,
        ack=Ack(
            deal_id=int(ack["deal_id"]),
            task_index=int(ack["task_index"]),
            request_hash=request_hash,
            price=int(ack["price"]),
        ),
        ack_sig=ack_sig,
        acked_at=acked_at,
        protocol=protocol,
        legacy_ack=ack,
    )


class Journal:
    """The append-only SQLite journal with an in-memory index of every deal.

    Thread-safe: one connection, one lock; writes commit before the method returns.
    """

    def __init__(self, path: Path, provider: str, domain: Domain, *, durable: bool = False) -> None:
        """Open (or create) the journal at ``path`` and verify it.

        ``provider`` signs receipts under ``domain``; a journal written for another provider,
        chain or escrow fails verification.
        """
        self.path = path
        self.provider = provider
        self.domain = domain
        self._lock = threading.RLock()
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute(f"PRAGMA synchronous={'FULL' if durable else 'NORMAL'}")
            self.migrated_from = self._migrate()
            self._blobs = {bytes(row[0]) for row in self._db.execute("SELECT sha256 FROM blobs")}
        except sqlite3.Error as exc:
            raise JournalError(f"cannot open the journal at {path}: {exc}") from exc
        self._deals: dict[int, DealBook] = {}
        self._new_blobs: list[tuple[bytes, bytes]] = []  # blobs of the ack being inserted
        self._deferred: dict[Key, tuple[AckRecord, bytes]] = {}  # acks not yet committed
        self._quotes: dict[str, list[QuoteRecord]] = {}
        self._load()
        self.verify()

    def close(self) -> None:
        """Close the database."""
        with self._lock:
            self._db.close()

    def _migrate(self) -> int | None:
        """Create or migrate the schema to :data:`SCHEMA_VERSION`; return the version migrated
        from (None when the journal was current or new). One transaction: all or nothing."""
        version = int(self._db.execute("PRAGMA user_version").fetchone()[0])
        if version > SCHEMA_VERSION:
            raise JournalError(
                f"the journal at {self.path} has schema version {version}; this daemon knows "
                f"up to {SCHEMA_VERSION} (a newer daemon wrote it)"
            )
        existed = (
            self._db.execute(
                "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'acks'"
            ).fetchone()
            is not None
        )
        if existed and version == SCHEMA_VERSION:
            return None
        columns = {row[1] for row in self._db.execute("PRAGMA table_info(acks)")}
        steps = []
        if existed:
            for column in ("program_sha256", "weights_sha256"):
                if column not in columns:  # written before blobs were shared
                    steps.append(f"ALTER TABLE acks ADD COLUMN {column} BLOB;")
            if "protocol" not in columns:  # written under settlement protocol v1
                steps.append("ALTER TABLE acks ADD COLUMN protocol INTEGER NOT NULL DEFAULT 1;")
        script = (
            "BEGIN IMMEDIATE;\n"
            + "\n".join(steps)
            + _SCHEMA
            + _append_only_triggers()
            + f"PRAGMA user_version = {SCHEMA_VERSION};\nCOMMIT;"
        )
        try:
            self._db.executescript(script)
        except BaseException:
            if self._db.in_transaction:
                self._db.execute("ROLLBACK")
            raise
        if not existed:
            return None
        log.warning(
            "journal migrated",
            extra={"path": str(self.path), "from_version": version or 1, "to": SCHEMA_VERSION},
        )
        return version or 1

    # ---- loading and verification --------------------------------------------------------

    def _book(self, deal_id: int) -> DealBook:
        book = self._deals.get(deal_id)
        if book is None:
            book = self._deals[deal_id] = DealBook({}, {}, [], [])
        return book

    def _load(self) -> None:
        rows = self._db.execute(
            "SELECT request_json, request_sig, request_hash, target, ack_json, ack_sig, acked_at, "
            "protocol FROM acks ORDER BY acked_at"
        )
        legacy: dict[int, int] = {}
        for req, req_sig, req_hash, target, ack, ack_sig, acked_at, protocol in rows:
            record = _ack_record(
                json.loads(req),
                bytes(req_sig),
                bytes(req_hash),
                target,
                json.loads(ack),
                bytes(ack_sig),
                float(acked_at),
                int(protocol),
            )
            book = self._book(record.ack.deal_id)
            book.acks[record.ack.task_index] = record
            book.ack_total += record.ack.price
            if not record.claimable:
                legacy[record.ack.deal_id] = legacy.get(record.ack.deal_id, 0) + 1
        for deal_id, count in sorted(legacy.items()):
            log.warning(
                "tasks acked under settlement protocol v1 cannot be claimed under v2 (their "
                "request signatures carry no deadline): only a voucher pays them",
                extra={"deal": deal_id, "tasks": count},
            )
        rows = self._db.execute(
            "SELECT seq, receipt_json, receipt_sig, receipt_hash, detail_json FROM receipts "
            "ORDER BY seq"
        )
        for seq, receipt_json, sig, receipt_hash, detail in rows:
            receipt = Receipt.from_json(json.loads(receipt_json))
            book = self._book(receipt.deal_id)
            book.receipts[receipt.task_index] = ReceiptRecord(
                receipt=receipt,
                signature=bytes(sig),
                receipt_hash=bytes(receipt_hash),
                detail=json.loads(detail),
                seq=int(seq),
            )
            book.last_receipt_hash = bytes(receipt_hash)
        for seq, deal, voucher_json, sig, received_at in self._db.execute(
            "SELECT seq, deal_id, voucher_json, signature, received_at FROM vouchers ORDER BY seq"
        ):
            self._book(int(deal)).vouchers.append(
                VoucherRecord(
                    voucher=Voucher.from_json(json.loads(voucher_json)),
                    signature=bytes(sig),
                    received_at=float(received_at),
                    seq=int(seq),
                )
            )
        for seq, deal, action, data, tx_hash, at in self._db.execute(
            "SELECT seq, deal_id, action, data_json, tx_hash, recorded_at FROM settlements "
            "ORDER BY seq"
        ):
            self._book(int(deal)).settlements.append(
                SettlementRecord(int(deal), action, json.loads(data), tx_hash, float(at), int(seq))
            )
        for seq, deal_key, quote_json, sig, signed_at in self._db.execute(
            "SELECT seq, market_deal_id, quote_json, signature, signed_at FROM quotes ORDER BY seq"
        ):
            self._quotes.setdefault(str(deal_key), []).append(
                QuoteRecord(
                    str(deal_key),
                    Quote.from_json(json.loads(quote_json)),
                    bytes(sig),
                    float(signed_at),
                    int(seq),
                )
            )

    def verify(self) -> int:
        """Check every deal's receipt chain, hashes and signatures; return receipts checked.

        Raise :class:`JournalCorruptError` on a broken link, a hash that does not match its
        receipt, a receipt not signed by this provider, or a receipt without an ack.
        """
        checked = 0
        with self._lock:
            for deal_id, book in self._deals.items():
                previous = ZERO_HASH
                for record in sorted(book.receipts.values(), key=lambda r: r.seq):
                    receipt = record.receipt
                    where = f"deal {deal_id} task {receipt.task_index}"
                    if receipt.prev_receipt_hash != previous:
                        raise JournalCorruptError(f"{where}: receipt chain broken")
                    if receipt.struct_hash() != record.receipt_hash:
                        raise JournalCorruptError(f"{where}: stored hash differs from receipt")
                    ack = book.acks.get(receipt.task_index)
                    if ack is None:
                        raise JournalCorruptError(f"{where}: receipt without an ack")
                    if receipt.deadline != ack.request.deadline:
                        raise JournalCorruptError(f"{where}: receipt deadline differs from request")
                    try:
                        signer = recover_digest(
                            self._digest(receipt, ack.protocol), record.signature
                        )
                    except SignatureError as exc:
                        raise JournalCorruptError(f"{where}: bad receipt signature") from exc
                    if signer.lower() != self.provider.lower():
                        raise JournalCorruptError(f"{where}: receipt signed by {signer}")
                    previous = record.receipt_hash
                    checked += 1
                if previous != book.last_receipt_hash:
                    raise JournalCorruptError(f"deal {deal_id}: chain head mismatch")
        return checked

    def _digest(self, receipt: Receipt, protocol: int = PROTOCOL) -> bytes:
        """Return a receipt's digest under the domain version of the protocol it was signed in."""
        if protocol == PROTOCOL:
            return receipt.digest(self.domain)
        return receipt.digest(replace(self.domain, version=str(protocol)))

    # ---- reads -------------------------------------------------------------------------

    def deal(self, deal_id: int) -> DealBook | None:
        """Return the in-memory book of a deal, if the journal has seen it."""
        return self._deals.get(deal_id)

    def deal_ids(self) -> list[int]:
        """Return every deal the journal has seen."""
        with self._lock:
            return list(self._deals)

    def ack(self, key: Key) -> AckRecord | None:
        """Return the ack of a task, if accepted."""
        book = self._deals.get(key[0])
        return None if book is None else book.acks.get(key[1])

    def receipt(self, key: Key) -> ReceiptRecord | None:
        """Return the receipt of a delivered task, if any."""
        book = self._deals.get(key[0])
        return None if book is None else book.receipts.get(key[1])

    def outputs(self, key: Key) -> bytes:
        """Return the stored outputs of a delivered task (empty for failures and compiles)."""
        with self._lock:
            row = self._db.execute(
                "SELECT outputs FROM receipts WHERE deal_id = ? AND task_index = ?",
                (str(key[0]), key[1]),
            ).fetchone()
        return b"" if row is None else bytes(row[0])

    def envelope(self, key: Key) -> bytes:
        """Return the envelope bytes an acked task was submitted with."""
        with self._lock:
            deferred = self._deferred.get(key)
            if deferred is not None:
                return deferred[1]
            row = self._db.execute(
                "SELECT envelope, program_sha256, weights_sha256 FROM acks "
                "WHERE deal_id = ? AND task_index = ?",
                (str(key[0]), key[1]),
            ).fetchone()
            if row is None:
                raise JournalError(f"no envelope journaled for task {key}")
            frame, program_sha, weights_sha = row
            if program_sha is None:  # stored whole
                return bytes(frame)
            program = self._blob(bytes(program_sha))
            weights = b"" if weights_sha is None else self._blob(bytes(weights_sha))
        return join_envelope(bytes(frame), program, weights)

    def _blob(self, sha: bytes) -> bytes:
        row = self._db.execute("SELECT data FROM blobs WHERE sha256 = ?", (sha,)).fetchone()
        if row is None:
            raise JournalCorruptError(f"blob {sha.hex()} of a journaled envelope is missing")
        return bytes(row[0])

    def unfinished(self) -> list[AckRecord]:
        """Return acked tasks without a receipt, oldest first."""
        with self._lock:
            pending = [
                a for b in self._deals.values() for i, a in b.acks.items() if i not in b.receipts
            ]
        return sorted(pending, key=lambda a: a.acked_at)

    def iter_books(self) -> Iterator[tuple[int, DealBook]]:
        """Yield (deal id, book) for every deal, under no lock (for jobs; they re-check)."""
        yield from list(self._deals.items())

    # ---- writes ------------------------------------------------------------------------

    def record_ack(self, record: AckRecord, envelope: bytes, *, defer: bool = False) -> None:
        """Append an ack with the request and envelope it answers.

        With ``defer`` the ack is held in memory (it counts for budgets and idempotency at
        once) and committed by :meth:`make_durable`, or with the task's receipt by
        :meth:`record_receipt`, whichever comes first. The caller must call
        :meth:`make_durable` before the ack leaves the process without its receipt.
        """
        deal_id, index = record.key
        with self._lock:
            if defer:
                self._deferred[record.key] = (record, envelope)
            else:
                self._insert_ack(record, envelope)
            book = self._book(deal_id)
            book.acks[index] = record
            book.ack_total += record.ack.price

    def make_durable(self, key: Key) -> None:
        """Commit a deferred ack now (nothing to do when it is committed already)."""
        if key not in self._deferred:
            return
        with self._lock:
            deferred = self._deferred.get(key)
            if deferred is not None:
                self._insert_ack(*deferred)
                del self._deferred[key]

    def _insert_ack(self, record: AckRecord, envelope: bytes) -> None:
        """Insert an ack row, its program and weights as blobs (in the caller's transaction, or
        in one of its own)."""
        deal_id, index = record.key
        frame, program_sha, weights_sha = envelope, None, None
        with contextlib.suppress(ProgramFormatError):  # not an envelope: stored whole
            frame, program, weights = split_envelope(envelope)
            program_sha = self._store_blob(program)
            weights_sha = self._store_blob(weights) if weights else None
        own = not self._db.in_transaction
        if own:
            self._db.execute("BEGIN")
        try:
            for sha, data in self._new_blobs:
                self._db.execute("INSERT INTO blobs (sha256, data) VALUES (?, ?)", (sha, data))
            self._db.execute(
                "INSERT INTO acks (deal_id, task_index, request_json, request_sig, request_hash, "
                "target, envelope, ack_json, ack_sig, acked_at, program_sha256, weights_sha256, "
                "protocol) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)",
                (
                    str(deal_id),
                    index,
                    json.dumps(record.request.to_json()),
                    record.request_sig,
                    record.request_hash,
                    record.target,
                    frame,
                    json.dumps(record.ack_json()),
                    record.ack_sig,
                    record.acked_at,
                    program_sha,
                    weights_sha,
                    record.protocol,
                ),
            )
            if own:
                self._db.execute("COMMIT")
        except BaseException:
            if own:
                if self._db.in_transaction:
                    self._db.execute("ROLLBACK")
                self._settle_blobs(committed=False)
            raise
        if own:
            self._settle_blobs(committed=True)

    def _settle_blobs(self, *, committed: bool) -> None:
        """Remember the queued blobs as stored once their transaction committed; forget them
        when it rolled back (a later ack stores them again)."""
        if committed:
            self._blobs.update(sha for sha, _ in self._new_blobs)
        self._new_blobs.clear()

    def _store_blob(self, data: bytes) -> bytes:
        """Return the content hash of ``data``, queueing it for the next ack insert if new."""
        sha = hashlib.sha256(data).digest()
        if sha not in self._blobs and all(sha != queued for queued, _ in self._new_blobs):
            self._new_blobs.append((sha, data))
        return sha

    def next_prev_hash(self, deal_id: int) -> bytes:
        """Return the hash the deal's next receipt must chain to (hold :meth:`lock`)."""
        return self._book(deal_id).last_receipt_hash

    @property
    def lock(self) -> threading.RLock:
        """Return the lock that serializes receipt chaining with :meth:`record_receipt`."""
        return self._lock

    def record_receipt(
        self,
        receipt: Receipt,
        signature: bytes,
        outputs: bytes,
        detail: dict[str, Any],
        *,
        receipt_hash: bytes | None = None,
    ) -> ReceiptRecord:
        """Append a signed receipt and its result; it must extend the deal's chain.

        ``receipt_hash`` saves recomputing the struct hash when the caller has it.
        """
        if receipt_hash is None:
            receipt_hash = receipt.struct_hash()
        with self._lock:
            book = self._book(receipt.deal_id)
            if receipt.prev_receipt_hash != book.last_receipt_hash:
                raise JournalError("receipt does not extend its deal's chain")
            if receipt.task_index in book.receipts:
                raise JournalError(f"task {receipt.task_index} already has a receipt")
            key = (receipt.deal_id, receipt.task_index)
            deferred = self._deferred.get(key)
            if deferred is not None:
                self._db.execute("BEGIN")  # the ack and its receipt: one commit
            try:
                if deferred is not None:
                    self._insert_ack(*deferred)
                cursor = self._db.execute(
                    "INSERT INTO receipts (deal_id, task_index, receipt_json, receipt_sig, "
                    "receipt_hash, outputs, detail_json, recorded_at) VALUES (?,?,?,?,?,?,?,?)",
                    (
                        str(receipt.deal_id),
                        receipt.task_index,
                        json.dumps(receipt.to_json()),
                        signature,
                        receipt_hash,
                        outputs,
                        json.dumps(detail),
                        _now(),
                    ),
                )
                if deferred is not None:
                    self._db.execute("COMMIT")
            except BaseException:
                if deferred is not None and self._db.in_transaction:
                    self._db.execute("ROLLBACK")
                self._settle_blobs(committed=False)
                raise
            self._settle_blobs(committed=True)
            self._deferred.pop(key, None)
            record = ReceiptRecord(
                receipt, signature, receipt_hash, detail, int(cursor.lastrowid or 0)
            )
            book.receipts[receipt.task_index] = record
            book.last_receipt_hash = receipt_hash
        return record

    def record_voucher(self, voucher: Voucher, signature: bytes) -> VoucherRecord:
        """Append an accepted voucher."""
        received = _now()
        with self._lock:
            cursor = self._db.execute(
                "INSERT INTO vouchers (deal_id, voucher_json, signature, received_at) "
                "VALUES (?,?,?,?)",
                (str(voucher.deal_id), json.dumps(voucher.to_json()), signature, received),
            )
            record = VoucherRecord(voucher, signature, received, int(cursor.lastrowid or 0))
            self._book(voucher.deal_id).vouchers.append(record)
        return record

    def record_settlement(
        self, deal_id: int, action: str, data: dict[str, Any], tx_hash: str | None
    ) -> SettlementRecord:
        """Append an on-chain settlement step of a deal."""
        at = _now()
        with self._lock:
            cursor = self._db.execute(
                "INSERT INTO settlements (deal_id, action, data_json, tx_hash, recorded_at) "
                "VALUES (?,?,?,?,?)",
                (str(deal_id), action, json.dumps(data), tx_hash, at),
            )
            record = SettlementRecord(
                deal_id, action, data, tx_hash, at, int(cursor.lastrowid or 0)
            )
            book = self._book(deal_id)
            book.settlements.append(record)
            book.changed()
        return record

    def record_quote(self, market_deal_id: str, quote: Quote, signature: bytes) -> QuoteRecord:
        """Append a per-fill quote signed for a market deal."""
        at = _now()
        with self._lock:
            cursor = self._db.execute(
                "INSERT INTO quotes (market_deal_id, quote_json, signature, signed_at) "
                "VALUES (?,?,?,?)",
                (market_deal_id, json.dumps(quote.to_json()), signature, at),
            )
            record = QuoteRecord(market_deal_id, quote, signature, at, int(cursor.lastrowid or 0))
            self._quotes.setdefault(market_deal_id, []).append(record)
        return record

    def quotes(self, market_deal_id: str | None = None) -> list[QuoteRecord]:
        """Return the quotes signed for one market deal (or for all), oldest first."""
        with self._lock:
            if market_deal_id is not None:
                return list(self._quotes.get(market_deal_id, ()))
            return sorted((q for qs in self._quotes.values() for q in qs), key=lambda q: q.seq)

    def meta(self, key: str) -> str | None:
        """Return a stored cursor or setting, if any."""
        with self._lock:
            row = self._db.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return None if row is None else str(row[0])

    def set_meta(self, key: str, value: str) -> None:
        """Store a cursor or setting (the one table that is not append-only)."""
        with self._lock:
            self._db.execute(
                "INSERT INTO meta (key, value) VALUES (?, ?) "
                "ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                (key, value),
            )

    def schema_version(self) -> int:
        """Return the schema version of the open journal."""
        with self._lock:
            return int(self._db.execute("PRAGMA user_version").fetchone()[0])
