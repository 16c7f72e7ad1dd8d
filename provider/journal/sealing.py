"""Sealing: a closed and settled deal's rows summed into a checkpoint the provider signs.

A deal is sealable once it is closed on chain (the escrow closes a deal only when no claim is
pending), every acked task has its receipt and no claim is in flight
(:meth:`DealBook.sealable`). Its rows are then summed from the database
(:func:`provider.journal.verification.summarize_deal`, which checks the receipt chain and
signatures on the way), the sum is compared with the deal's book in memory, signed with the
provider's key and stored in ``seals`` in one transaction. From then on:

- opening the journal reads no row of the deal and verifies none (the cost of an open grows
  with the deals still open, not with the history);
- triggers refuse any new row for the deal (a late voucher is refused, never half-recorded);
- the deal's rows stay in their tables, read on demand (a client re-fetching a result), and a
  full verification (``tpumarket provider verify-journal``, or the daemon's background check)
  sums them again and compares with the signed checkpoint: a row changed after the seal is
  caught.

A crash mid-seal leaves no seal (one transaction): the deal is loaded, verified and sealed at
the next open.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
import time

from contracts.messages import Domain, sign_digest
from provider.errors import JournalCorruptError
from provider.journal.records import DealBook
from provider.journal.retention import Retention
from provider.journal.verification import DealSummary, VerifyReport, summarize_deal, verify_deals

log = logging.getLogger("provider.journal")

VERIFY_CURSOR = "verify_cursor"
"""Meta key: the ``deals`` rowid the background check of sealed deals reached."""


def checkpoint_of(
    reader: sqlite3.Connection, deal_id: int, provider: str, domain: Domain
) -> DealSummary:
    """Sum a deal's rows as committed (checking its receipt chain): its checkpoint."""
    return summarize_deal(reader, deal_id, provider, domain)


def matches_book(summary: DealSummary, book: DealBook) -> bool:
    """Return whether the committed rows are all the book holds (no ack still deferred, no
    row appended since they were summed)."""
    return (
        summary.acks == len(book.acks)
        and summary.receipts == len(book.receipts)
        and summary.chain_head == "0x" + book.last_receipt_hash.hex()
        and summary.vouchers == len(book.vouchers)
        and summary.settlements == len(book.settlements)
    )


def store_seal(db: sqlite3.Connection, summary: DealSummary, private_key: str) -> None:
    """Sign the checkpoint and insert the seal (in the caller's transaction, or its own)."""
    signature = sign_digest(summary.seal_digest(), private_key)
    db.execute(
        "INSERT INTO seals (deal_id, checkpoint_json, signature, sealed_at) VALUES (?, ?, ?, ?)",
        (str(summary.deal_id), summary.canonical(), signature, time.time()),
    )


class Sealing(Retention):
    """Sealing and the background check of sealed deals (a part of the journal)."""

    provider: str
    domain: Domain
    _db: sqlite3.Connection
    _reader: sqlite3.Connection
    _lock: threading.RLock
    _read_lock: threading.Lock
    _deals: dict[int, DealBook]
    _key: str | None

    def seal_ready(self, limit: int | None = None) -> list[int]:
        """Seal open deals that are closed and settled (up to ``limit``); return them.

        Each deal's rows are summed outside the write lock (the chain checked on the way),
        then, under it, compared with its book, signed and stored; the book leaves memory.
        Nothing is sealed without the provider's key. Settled tasks' data is pruned first
        (:meth:`prune_settled`), so a sealed deal holds none.
        """
        self.prune_settled()
        if self._key is None:
            return []
        with self._lock:
            ready = [deal_id for deal_id, book in self._deals.items() if book.sealable()]
        sealed = []
        for deal_id in ready[:limit]:
            try:
                with self._read_lock:
                    summary = checkpoint_of(self._reader, deal_id, self.provider, self.domain)
            except JournalCorruptError as exc:
                log.error("deal not sealed: its rows do not verify", extra={"error": str(exc)})
                continue
            with self._lock:
                book = self._deals.get(deal_id)
                if book is None or not book.sealable() or not matches_book(summary, book):
                    continue  # a row came meanwhile: the next pass sees it
                store_seal(self._db, summary, self._key)
                del self._deals[deal_id]
            sealed.append(deal_id)
        if sealed:
            log.info("deals sealed", extra={"deals": sealed})
        return sealed

    def sealed(self, deal_id: int) -> bool:
        """Return whether a deal is sealed (closed and settled; nothing more is recorded)."""
        with self._lock:
            row = self._db.execute(
                "SELECT 1 FROM seals WHERE deal_id = ?", (str(deal_id),)
            ).fetchone()
        return row is not None

    def verify_sealed_batch(self, limit: int = 100) -> VerifyReport:
        """Check up to ``limit`` sealed deals against their seals, from where the last batch
        stopped (starting over after the last one); log each problem as an error."""
        with self._read_lock:
            row = self._reader.execute(
                "SELECT value FROM meta WHERE key = ?", (VERIFY_CURSOR,)
            ).fetchone()
            stored = None if row is None else str(row[0])
            report = verify_deals(
                self._reader,
                self.provider,
                self.domain,
                after_rowid=0 if stored is None else int(stored),
                limit=limit,
                only_sealed=True,
            )
        done = report.deals < limit  # reached the last sealed deal: start over next time
        with self._lock:
            self._db.execute(
                "INSERT INTO meta (key, value) VALUES (?, ?) "
                "ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                (VERIFY_CURSOR, "0" if done else str(report.last_deal_rowid)),
            )
        for problem in report.problems:
            log.error("sealed deal fails verification", extra={"problem": problem})
        return report
