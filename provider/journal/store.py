"""The crash-safe journal: acks, chained receipts with results, vouchers, settlements.

SQLite in WAL mode with ``synchronous=NORMAL``: every commit is in the OS before the call
returns, so a ``kill -9`` of the daemon loses nothing it answered (an ack may be deferred to
commit with its receipt, but never leaves the process uncommitted: see
:meth:`Journal.record_ack`) (power loss may lose the last transactions; set
``synchronous=FULL`` through ``durable=True`` for that). Tables are append-only, enforced by
triggers: state changes are new rows (a redeemed voucher, a claimed batch, a finalized batch),
never updates; only ``meta`` (cursors of chain scans) is updated.

An ack keeps the envelope it answers, so an acked task can be re-run after a crash
(:mod:`provider.journal.envelopes`: programs and weights stored once per content hash).

Memory holds the books of open deals only: a closed and settled deal is sealed
(:mod:`provider.journal.sealing`) and its rows are read on demand, never at open. Opening
reads and verifies the open deals' rows (:mod:`provider.journal.verification`); the sealed
ones are checked by a full verification, streamed (``tpumarket provider verify-journal``) or a
batch at a time in the background (:meth:`Journal.verify_sealed_batch`).

The schema is versioned (:mod:`provider.journal.schema`); an older journal is migrated in one
transaction when opened. Rows acked under settlement protocol v1 stay readable (their receipts
verify under the escrow domain of version ``1``), but they cannot be claimed under v2: their
request signatures carry no deadline (a warning names such deals).
"""

from __future__ import annotations

import contextlib
import json
import logging
import sqlite3
import threading
import time
from collections import OrderedDict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from contracts.messages import Domain, Quote, Receipt, Voucher, address_of
from provider.errors import JournalError, RejectedError
from provider.journal.envelopes import EnvelopeStore
from provider.journal.records import (
    AckRecord,
    DealBook,
    Key,
    QuoteRecord,
    ReceiptRecord,
    SettlementRecord,
    VoucherRecord,
)
from provider.journal.retention import OUTPUTS, OutputsPrunedError, releasable
from provider.journal.rows import (
    ACK_COLUMNS,
    QUOTE_COLUMNS,
    RECEIPT_COLUMNS,
    ack_of_row,
    quote_of_row,
    read_book,
    receipt_of_row,
)
from provider.journal.schema import SEALED, migrate
from provider.journal.sealing import Sealing
from provider.journal.verification import verify_book
from provider.lifecycle import SettlementAction

log = logging.getLogger("provider.journal")

DOMAIN_META = "journal_domain"
"""Meta key: the provider and escrow domain the journal's receipts are signed for."""
_SEALED_CACHE = 8  # books of sealed deals read back, kept for repeated reads


def _now() -> float:
    return time.time()


class Journal(EnvelopeStore, Sealing):
    """The append-only SQLite journal with an in-memory index of every open deal.

    Thread-safe: one writing connection, one lock; writes commit before the method returns.
    A second connection reads for sealing and background verification.
    """

    def __init__(
        self,
        path: Path,
        provider: str,
        domain: Domain,
        *,
        durable: bool = False,
        private_key: str | None = None,
    ) -> None:
        """Open (or create) the journal at ``path`` and verify its open deals.

        ``provider`` signs receipts under ``domain``; a journal written for another provider,
        chain or escrow fails verification. With ``private_key`` (the provider's) closed and
        settled deals are sealed; without it the journal seals nothing.
        """
        if private_key is not None and address_of(private_key).lower() != provider.lower():
            raise JournalError("the sealing key is not the provider's")
        self.path = path
        self.provider = provider
        self.domain = domain
        self._key = private_key
        self._lock = threading.RLock()
        self._read_lock = threading.Lock()
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute(f"PRAGMA synchronous={'FULL' if durable else 'NORMAL'}")
            self.migrated_from = migrate(self._db, path)
            self._reader = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
            self._record_domain()
        except sqlite3.Error as exc:
            raise JournalError(f"cannot open the journal at {path}: {exc}") from exc
        self._blobs: set[bytes] = set()  # a cache: hashes known stored
        self._deals: dict[int, DealBook] = {}
        self._sealed_books: OrderedDict[int, DealBook] = OrderedDict()
        self._new_blobs: list[tuple[bytes, bytes]] = []  # blobs of the ack being inserted
        self._deferred: dict[Key, tuple[AckRecord, bytes]] = {}  # acks not yet committed
        self._load()
        self._load_retention()
        self.verify()
        self.seal_ready()

    def close(self) -> None:
        """Close the database."""
        with self._lock, self._read_lock:
            self._reader.close()
            self._db.close()

    def _record_domain(self) -> None:
        value = json.dumps(
            {
                "provider": self.provider,
                "chain_id": self.domain.chain_id,
                "escrow": self.domain.verifying_contract,
                "name": self.domain.name,
                "version": self.domain.version,
            },
            sort_keys=True,
        )
        if self.meta(DOMAIN_META) != value:
            self.set_meta(DOMAIN_META, value)

    # ---- loading and verification --------------------------------------------------------

    def _load(self) -> None:
        """Read the books of the deals not sealed (the open ones), nothing of the others."""
        open_deals = [
            int(row[0])
            for row in self._db.execute(
                "SELECT deal_id FROM deals d WHERE NOT EXISTS "
                "(SELECT 1 FROM seals s WHERE s.deal_id = d.deal_id) ORDER BY rowid"
            )
        ]
        for deal_id in open_deals:
            book = self._deals[deal_id] = read_book(self._db, deal_id, sealed=False)
            legacy = sum(not a.claimable for a in book.acks.values())
            if legacy:
                log.warning(
                    "tasks acked under settlement protocol v1 cannot be claimed under v2 (their "
                    "request signatures carry no deadline): only a voucher pays them",
                    extra={"deal": deal_id, "tasks": legacy},
                )

    def verify(self) -> int:
        """Check every open deal's receipt chain, hashes and signatures; return receipts
        checked (sealed deals: :meth:`verify_sealed_batch` and ``verify-journal``).

        Raise :class:`JournalCorruptError` on a broken link, a hash that does not match its
        receipt, a receipt not signed by this provider, or a receipt without an ack.
        """
        with self._lock:
            return sum(
                verify_book(deal_id, book, self.provider, self.domain)
                for deal_id, book in self._deals.items()
            )

    # ---- reads -------------------------------------------------------------------------

    def deal(self, deal_id: int) -> DealBook | None:
        """Return the book of a deal, if the journal has seen it.

        An open deal's book is the live one; a sealed deal's is read back from its rows (a
        copy marked ``sealed``: nothing can be recorded in it).
        """
        book = self._deals.get(deal_id)
        if book is not None:
            return book
        with self._lock:
            book = self._sealed_books.get(deal_id)
            if book is not None:
                self._sealed_books.move_to_end(deal_id)
                return book
            if not self.sealed(deal_id):
                return self._deals.get(deal_id)
            book = self._sealed_books[deal_id] = read_book(self._db, deal_id, sealed=True)
            while len(self._sealed_books) > _SEALED_CACHE:
                self._sealed_books.popitem(last=False)
            return book

    def deal_ids(self) -> list[int]:
        """Return every deal the journal has seen, sealed ones included."""
        with self._lock:
            return [int(row[0]) for row in self._db.execute("SELECT deal_id FROM deals")]

    def open_deal_ids(self) -> list[int]:
        """Return the deals not sealed (their books are in memory)."""
        with self._lock:
            return list(self._deals)

    def ack(self, key: Key) -> AckRecord | None:
        """Return the ack of a task, if accepted."""
        book = self._deals.get(key[0])
        if book is not None:
            return book.acks.get(key[1])
        with self._lock:  # a sealed deal, or none: read the row
            row = self._db.execute(
                f"SELECT {ACK_COLUMNS} FROM acks WHERE deal_id = ? AND task_index = ?",
                (str(key[0]), key[1]),
            ).fetchone()
        return None if row is None else ack_of_row(row)

    def receipt(self, key: Key) -> ReceiptRecord | None:
        """Return the receipt of a delivered task, if any."""
        book = self._deals.get(key[0])
        if book is not None:
            return book.receipts.get(key[1])
        with self._lock:
            row = self._db.execute(
                f"SELECT {RECEIPT_COLUMNS} FROM receipts WHERE deal_id = ? AND task_index = ?",
                (str(key[0]), key[1]),
            ).fetchone()
        return None if row is None else receipt_of_row(row)

    def outputs(self, key: Key) -> bytes:
        """Return the stored outputs of a delivered task (empty for failures and compiles);
        raise :class:`OutputsPrunedError` once they were pruned (the task is settled)."""
        with self._lock:
            stored = self._task_data(key, OUTPUTS)
            if stored is not None:
                return stored
            if self.is_pruned(key):
                raise OutputsPrunedError(key)
            row = self._db.execute(
                "SELECT outputs FROM receipts WHERE deal_id = ? AND task_index = ?",
                (str(key[0]), key[1]),
            ).fetchone()
        return b"" if row is None else bytes(row[0])

    def unfinished(self) -> list[AckRecord]:
        """Return acked tasks without a receipt, oldest first."""
        with self._lock:
            pending = [
                a for b in self._deals.values() for i, a in b.acks.items() if i not in b.receipts
            ]
        return sorted(pending, key=lambda a: a.acked_at)

    def iter_books(self) -> Iterator[tuple[int, DealBook]]:
        """Yield (deal id, book) for every open deal, under no lock (for jobs; they re-check).

        Sealed deals are closed and settled: no job has anything left to do for them.
        """
        yield from list(self._deals.items())

    def settlement_history(self) -> Iterator[tuple[str, dict[str, Any]]]:
        """Yield (action, data) of every settlement row, sealed deals included, oldest first
        (streamed: to recount the money metrics at start)."""
        db = sqlite3.connect(f"file:{self.path}?mode=ro", uri=True)  # its own: no lock held
        try:
            rows = db.execute("SELECT action, data_json FROM settlements ORDER BY seq")
            while batch := rows.fetchmany(1000):
                for action, data in batch:
                    yield str(action), json.loads(data)
        finally:
            db.close()

    # ---- writes ------------------------------------------------------------------------

    def _open_book(self, deal_id: int) -> DealBook:
        """Return the live book of a deal, created if new; refuse a sealed deal (hold the
        lock)."""
        book = self._deals.get(deal_id)
        if book is None:
            if self.sealed(deal_id):
                raise RejectedError(
                    "deal_not_open", f"deal {deal_id} is closed and settled: nothing more is taken"
                )
            book = self._deals[deal_id] = DealBook({}, {}, [], [])
        return book

    @contextlib.contextmanager
    def _writing(self, deal_id: int) -> Iterator[None]:
        """Turn the triggers' refusal of a row for a sealed deal into a rejection."""
        try:
            yield
        except sqlite3.IntegrityError as exc:
            if SEALED in str(exc):
                raise RejectedError("deal_not_open", f"deal {deal_id} is sealed") from exc
            raise JournalError(f"journal write refused: {exc}") from exc

    def record_ack(self, record: AckRecord, envelope: bytes, *, defer: bool = False) -> None:
        """Append an ack with the request and envelope it answers.

        With ``defer`` the ack is held in memory (it counts for budgets and idempotency at
        once) and committed by :meth:`make_durable`, or with the task's receipt by
        :meth:`record_receipt`, whichever comes first. The caller must call
        :meth:`make_durable` before the ack leaves the process without its receipt.
        """
        deal_id, index = record.key
        with self._lock:
            book = self._open_book(deal_id)
            if defer:
                self._deferred[record.key] = (record, envelope)
            else:
                with self._writing(deal_id):
                    self._insert_ack(record, envelope)
            self._charge(deal_id, len(envelope))
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

    def next_prev_hash(self, deal_id: int) -> bytes:
        """Return the hash the deal's next receipt must chain to (hold :meth:`lock`)."""
        return self._open_book(deal_id).last_receipt_hash

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
            book = self._open_book(receipt.deal_id)
            if receipt.prev_receipt_hash != book.last_receipt_hash:
                raise JournalError("receipt does not extend its deal's chain")
            if receipt.task_index in book.receipts:
                raise JournalError(f"task {receipt.task_index} already has a receipt")
            key = (receipt.deal_id, receipt.task_index)
            deferred = self._deferred.get(key)
            self._db.execute("BEGIN")  # the receipt, its outputs (and a deferred ack): one commit
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
                        b"",  # schema 4: outputs are task data, pruned once settled
                        json.dumps(detail),
                        _now(),
                    ),
                )
                if outputs:
                    self._put_task_data(key, OUTPUTS, outputs, len(outputs))
                self._db.execute("COMMIT")
            except BaseException:
                if self._db.in_transaction:
                    self._db.execute("ROLLBACK")
                self._settle_blobs(committed=False)
                raise
            self._settle_blobs(committed=True)
            self._charge(receipt.deal_id, len(outputs))
            self._deferred.pop(key, None)
            record = ReceiptRecord(
                receipt, signature, receipt_hash, detail, int(cursor.lastrowid or 0)
            )
            book.receipts[receipt.task_index] = record
            book.last_receipt_hash = receipt_hash
        return record

    def record_voucher(self, voucher: Voucher, signature: bytes) -> VoucherRecord:
        """Append an accepted voucher (refused with ``deal_not_open`` for a sealed deal)."""
        received = _now()
        with self._lock:
            book = self._open_book(voucher.deal_id)
            with self._writing(voucher.deal_id):
                cursor = self._db.execute(
                    "INSERT INTO vouchers (deal_id, voucher_json, signature, received_at) "
                    "VALUES (?,?,?,?)",
                    (str(voucher.deal_id), json.dumps(voucher.to_json()), signature, received),
                )
            record = VoucherRecord(voucher, signature, received, int(cursor.lastrowid or 0))
            book.vouchers.append(record)
        return record

    def record_settlement(
        self, deal_id: int, action: str, data: dict[str, Any], tx_hash: str | None
    ) -> SettlementRecord:
        """Append an on-chain settlement step of a deal (``action``: a
        :class:`~provider.lifecycle.SettlementAction` or its string), then prune the tasks it
        leaves nothing to need (:mod:`provider.journal.retention`)."""
        step = SettlementAction(action)
        at = _now()
        with self._lock:
            book = self._open_book(deal_id)
            with self._writing(deal_id):
                cursor = self._db.execute(
                    "INSERT INTO settlements (deal_id, action, data_json, tx_hash, recorded_at) "
                    "VALUES (?,?,?,?,?)",
                    (str(deal_id), step.value, json.dumps(data), tx_hash, at),
                )
            record = SettlementRecord(deal_id, step, data, tx_hash, at, int(cursor.lastrowid or 0))
            book.settlements.append(record)
            book.changed()
            try:  # what this step settled is needed no more (the upkeep retries a failure)
                self.prune(deal_id, releasable(book), step.value)
            except sqlite3.Error as exc:
                log.error("pruning settled tasks failed", extra={"error": str(exc)})
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
        return QuoteRecord(market_deal_id, quote, signature, at, int(cursor.lastrowid or 0))

    def quotes(
        self, market_deal_id: str | None = None, *, valid_at: float | None = None
    ) -> list[QuoteRecord]:
        """Return the quotes signed for one market deal (or for all), oldest first; with
        ``valid_at``, only those still valid then (read from the database: quotes are not held
        in memory, and the filter runs in SQL, so the history is not parsed)."""
        where: list[str] = []
        params: list[str | float] = []
        if market_deal_id is not None:
            where.append("market_deal_id = ?")
            params.append(market_deal_id)
        if valid_at is not None:
            where.append("CAST(json_extract(quote_json, '$.valid_until') AS REAL) >= ?")
            params.append(valid_at)
        clause = f" WHERE {' AND '.join(where)}" if where else ""
        with self._lock:
            rows = self._db.execute(
                f"SELECT {QUOTE_COLUMNS} FROM quotes{clause} ORDER BY seq", params
            ).fetchall()
        return [quote_of_row(row) for row in rows]

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
