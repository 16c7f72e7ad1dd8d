"""Retention: a task's envelope and outputs kept only while something can still need them.

Each task's envelope frame (header and inputs) and delivered outputs live in ``task_data``,
outside the rows a seal signs; its program and weights in ``blobs``, shared by content hash.
They are needed to re-run the task after a crash (until its receipt), to answer its client
(until the chain has settled it) and as evidence for the arbiter (while a claim of it may be
disputed). Once nothing can still need them (:func:`releasable`) they are pruned: one
transaction appends a ``pruned`` row per task, deletes its ``task_data`` rows and every blob no
unpruned ack refers to any more. A kill mid-prune rolls the transaction back; a prune of a
task already pruned does nothing, so the next pass simply does it again.

A task is releasable once it has its receipt and one of these holds:

- a voucher redeemed on chain covers it (the client verified the outputs before vouching);
- it was refunded on chain;
- a claim of it ended: finalized (paid) or rejected (a dispute the arbiter ruled for the
  client or left to lapse); a claimed task under dispute keeps its outputs until then;
- the deal is closed on chain (the escrow closes a deal only once no claim is pending).

Rows written before schema 4 hold their data in the sealed columns: they are never pruned.

Storage is counted per deal as *charged* bytes: each task's envelope as uploaded (its program
and weights counted in full, even when stored once) plus its outputs, until pruned. The task
API refuses new tasks before their ack when a deal's or the provider's total reaches its bound
(:mod:`provider.storage_bounds`).
"""

from __future__ import annotations

import logging
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable

from provider.errors import RejectedError
from provider.journal.records import DealBook, Key
from provider.lifecycle import SettlementAction

log = logging.getLogger("provider.journal")

FRAME = "frame"
"""``task_data.part`` of an envelope's frame (header and inputs; the whole body when the
upload was no envelope)."""
OUTPUTS = "outputs"
"""``task_data.part`` of a delivered task's outputs."""


class OutputsPrunedError(RejectedError, LookupError):
    """The outputs of a task settled on chain were pruned (``outputs_pruned``)."""

    def __init__(self, key: Key) -> None:
        """Name the task whose outputs are gone."""
        super().__init__(
            "outputs_pruned",
            f"task {key[1]} of deal {key[0]} is settled on chain: its outputs are kept only "
            "until then",
        )


def releasable(book: DealBook) -> list[int]:
    """Return the delivered, unpruned tasks of ``book`` that nothing can still need (pure).

    See the module docstring for the rule. A task in a claim transaction still in flight is
    kept whatever else holds.
    """
    delivered = [i for i in book.receipts if i not in book.pruned and i not in book.claiming]
    if not delivered:
        return []
    if book.closed():
        return sorted(delivered)
    settled = set(book.refunded_tasks())
    ended = {
        int(s.data["batch_id"])
        for s in book.settlements
        if s.action in (SettlementAction.FINALIZE, SettlementAction.REJECTED)
    }
    for claim in book.settlements:
        if claim.action is SettlementAction.CLAIM and int(claim.data["batch_id"]) in ended:
            settled.update(int(i) for i in claim.data["tasks"])
    redeemed = book.redeemed()
    return sorted(
        i
        for i in delivered
        if i in settled or (redeemed is not None and redeemed.voucher.covers(i))
    )


class Retention:
    """Task data stored, counted and pruned (a part of :class:`provider.journal.Journal`)."""

    _db: sqlite3.Connection
    _lock: threading.RLock
    _deals: dict[int, DealBook]
    _blobs: set[bytes]
    _charged: dict[int, int]
    _prune_listeners: list[Callable[[int, list[int]], object]]

    def on_prune(self, listener: Callable[[int, list[int]], object]) -> None:
        """Call ``listener(deal_id, indexes)`` after each prune commits (to drop copies kept
        elsewhere, such as outputs in memory)."""
        self._prune_listeners.append(listener)

    def _load_retention(self) -> None:
        """Count the charged bytes each deal holds (at open)."""
        self._prune_listeners = []
        self._charged = {
            int(deal): int(total)
            for deal, total in self._db.execute(
                "SELECT deal_id, SUM(charged) FROM task_data GROUP BY deal_id"
            )
        }

    # ---- counting ----------------------------------------------------------------------

    def stored_bytes(self, deal_id: int | None = None) -> int:
        """Return the charged bytes one deal holds (``None``: all deals together)."""
        with self._lock:
            if deal_id is None:
                return sum(self._charged.values())
            return self._charged.get(deal_id, 0)

    def _charge(self, deal_id: int, size: int) -> None:
        """Count ``size`` more (or, negative, fewer) bytes for a deal (hold the lock)."""
        total = self._charged.get(deal_id, 0) + size
        if total > 0:
            self._charged[deal_id] = total
        else:
            self._charged.pop(deal_id, None)

    # ---- rows --------------------------------------------------------------------------

    def _put_task_data(self, key: Key, part: str, data: bytes, charged: int) -> None:
        """Insert a task's frame or outputs (in the caller's transaction)."""
        self._db.execute(
            "INSERT INTO task_data (deal_id, task_index, part, data, charged) "
            "VALUES (?, ?, ?, ?, ?)",
            (str(key[0]), key[1], part, data, charged),
        )

    def _task_data(self, key: Key, part: str) -> bytes | None:
        """Return a task's frame or outputs, None when there is no such row (hold the lock)."""
        row = self._db.execute(
            "SELECT data FROM task_data WHERE deal_id = ? AND task_index = ? AND part = ?",
            (str(key[0]), key[1], part),
        ).fetchone()
        return None if row is None else bytes(row[0])

    def is_pruned(self, key: Key) -> bool:
        """Return whether a task's envelope and outputs were pruned."""
        book = self._deals.get(key[0])
        if book is not None:
            return key[1] in book.pruned
        with self._lock:
            row = self._db.execute(
                "SELECT 1 FROM pruned WHERE deal_id = ? AND task_index = ?",
                (str(key[0]), key[1]),
            ).fetchone()
        return row is not None

    # ---- pruning -----------------------------------------------------------------------

    def prune(self, deal_id: int, indexes: Iterable[int], reason: str) -> list[int]:
        """Prune the given delivered tasks of a deal in one transaction; return those pruned
        now. Tasks already pruned, without a receipt, or written before schema 4 (their data
        is in rows a seal may sign: nothing to free) are left as they are."""
        deal = str(deal_id)
        with self._lock:
            book = self._deals.get(deal_id)
            todo = [
                i
                for i in sorted(set(indexes))
                if (book is None or i not in book.pruned)
                and not self._pruned_row(deal, i)
                and self._has_receipt(deal, i)
                and self._has_task_data(deal, i)
            ]
            if not todo:
                return []
            released = 0
            shas: set[bytes] = set()
            self._db.execute("BEGIN IMMEDIATE")
            try:
                for index in todo:
                    row = self._db.execute(
                        "SELECT COALESCE(SUM(charged), 0) FROM task_data "
                        "WHERE deal_id = ? AND task_index = ?",
                        (deal, index),
                    ).fetchone()
                    charged = int(row[0])
                    self._db.execute(
                        "INSERT INTO pruned (deal_id, task_index, reason, charged, pruned_at) "
                        "VALUES (?, ?, ?, ?, ?)",
                        (deal, index, reason, charged, time.time()),
                    )
                    self._db.execute(
                        "DELETE FROM task_data WHERE deal_id = ? AND task_index = ?",
                        (deal, index),
                    )
                    refs = self._db.execute(
                        "SELECT program_sha256, weights_sha256 FROM acks "
                        "WHERE deal_id = ? AND task_index = ?",
                        (deal, index),
                    ).fetchone()
                    shas.update(bytes(sha) for sha in refs or () if sha is not None)
                    released += charged
                gone = [sha for sha in sorted(shas) if self._drop_unreferenced_blob(sha)]
                self._db.execute("COMMIT")
            except BaseException:
                if self._db.in_transaction:
                    self._db.execute("ROLLBACK")
                raise
            self._blobs.difference_update(gone)
            self._charge(deal_id, -released)
            if book is not None:
                book.pruned.update(todo)
        log.info(
            "task data pruned",
            extra={"deal": deal_id, "tasks": len(todo), "bytes": released, "reason": reason},
        )
        for listener in self._prune_listeners:
            listener(deal_id, todo)
        return todo

    def _has_receipt(self, deal: str, index: int) -> bool:
        row = self._db.execute(
            "SELECT 1 FROM receipts WHERE deal_id = ? AND task_index = ?", (deal, index)
        ).fetchone()
        return row is not None

    def _has_task_data(self, deal: str, index: int) -> bool:
        row = self._db.execute(
            "SELECT 1 FROM task_data WHERE deal_id = ? AND task_index = ?", (deal, index)
        ).fetchone()
        return row is not None

    def _pruned_row(self, deal: str, index: int) -> bool:
        row = self._db.execute(
            "SELECT 1 FROM pruned WHERE deal_id = ? AND task_index = ?", (deal, index)
        ).fetchone()
        return row is not None

    def _drop_unreferenced_blob(self, sha: bytes) -> bool:
        """Delete a blob no unpruned ack refers to (in the caller's transaction)."""
        cursor = self._db.execute(
            "DELETE FROM blobs WHERE sha256 = ?1 AND NOT EXISTS (SELECT 1 FROM acks a WHERE "
            "a.program_sha256 = ?1 AND NOT EXISTS (SELECT 1 FROM pruned p WHERE "
            "p.deal_id = a.deal_id AND p.task_index = a.task_index)) AND NOT EXISTS "
            "(SELECT 1 FROM acks a WHERE a.weights_sha256 = ?1 AND NOT EXISTS (SELECT 1 FROM "
            "pruned p WHERE p.deal_id = a.deal_id AND p.task_index = a.task_index))",
            (sha,),
        )
        return cursor.rowcount > 0

    def prune_settled(self) -> dict[int, list[int]]:
        """Prune every task nothing can still need (:func:`releasable`), and whatever a
        sealed deal still holds; return the tasks pruned by deal."""
        done: dict[int, list[int]] = {}
        with self._lock:
            books = list(self._deals.items())
            sealed = [
                int(row[0])
                for row in self._db.execute(
                    "SELECT DISTINCT t.deal_id FROM task_data t JOIN seals s "
                    "ON s.deal_id = t.deal_id"
                )
            ]
        for deal_id, book in books:
            with self._lock:
                pruned = self.prune(deal_id, releasable(book), "settled")
            if pruned:
                done[deal_id] = pruned
        for deal_id in sealed:
            with self._lock:
                indexes = [
                    int(row[0])
                    for row in self._db.execute(
                        "SELECT DISTINCT task_index FROM task_data WHERE deal_id = ?",
                        (str(deal_id),),
                    )
                ]
            pruned = self.prune(deal_id, indexes, "sealed")
            if pruned:
                done[deal_id] = pruned
        return done
