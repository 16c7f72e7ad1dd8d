"""Envelopes in the journal: each ack's envelope, program and weights stored once per hash.

An ack keeps the envelope it answers, so an acked task can be re-run after a crash; program
and weights sections are stored once per content hash (table ``blobs``), the rest of the
envelope (header and inputs) in the ack's row: a model's weights are journaled once, not once
per task. Which hashes are stored is asked of the database, with a bounded cache in front.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import sqlite3
import threading

from programs.envelope import ProgramFormatError, join_envelope, split_envelope
from provider.errors import JournalCorruptError, JournalError
from provider.journal.records import AckRecord, Key
from provider.journal.retention import FRAME, Retention

_BLOB_CACHE = 4096  # content hashes known stored, before the cache starts over


class EnvelopeStore(Retention):
    """The ack rows with their envelopes (a part of :class:`provider.journal.Journal`).

    Since schema 4 an ack row's ``envelope`` column is empty: the frame is in ``task_data``
    (pruned once the task is settled, :mod:`provider.journal.retention`).
    """

    _db: sqlite3.Connection
    _lock: threading.RLock
    _blobs: set[bytes]  # a cache: hashes known stored
    _new_blobs: list[tuple[bytes, bytes]]  # blobs of the ack being inserted
    _deferred: dict[Key, tuple[AckRecord, bytes]]  # acks not yet committed

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
            if not frame:  # schema 4: the frame is task data
                stored = self._task_data(key, FRAME)
                if stored is None:
                    raise JournalError(
                        f"the envelope of task {key} was pruned (the task is settled)"
                        if self.is_pruned(key)
                        else f"no envelope journaled for task {key}"
                    )
                frame = stored
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
                    b"",
                    json.dumps(record.ack_json()),
                    record.ack_sig,
                    record.acked_at,
                    program_sha,
                    weights_sha,
                    record.protocol,
                ),
            )
            self._put_task_data(record.key, FRAME, frame, len(envelope))
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
            if len(self._blobs) >= _BLOB_CACHE:
                self._blobs.clear()
            self._blobs.update(sha for sha, _ in self._new_blobs)
        self._new_blobs.clear()

    def _store_blob(self, data: bytes) -> bytes:
        """Return the content hash of ``data``, queueing it for the next ack insert if new."""
        sha = hashlib.sha256(data).digest()
        if sha in self._blobs or any(sha == queued for queued, _ in self._new_blobs):
            return sha
        if self._db.execute("SELECT 1 FROM blobs WHERE sha256 = ?", (sha,)).fetchone():
            self._blobs.add(sha)
        else:
            self._new_blobs.append((sha, data))
        return sha
