"""A client's record of one deal, kept on disk between (and during) runs of ``tpumarket job``.

Vouchers are cumulative: the voucher a second run signs must pay the first run's tasks too,
and task indices must never repeat. The ledger keeps, per (chain, escrow, deal): the next free
task index, every task this client signed (its request and signature, the provider's ack, the
verified receipt and where its outputs are saved, its on-chain settlement), the last voucher
signed, the claimed batches seen on chain and what the client did about them, and the runs
that used the deal (so a rerun after a crash resumes the crashed run's tasks instead of paying
for the same inputs again).

Durability: the ledger is a snapshot (``deal-....json``, replaced atomically: a temporary
file, fsync, rename, fsync of the folder) plus an append-only log of task records
(``deal-....log``, one JSON line per change, fsync'd before the call returns). A task's ack
reaches the disk before the client waits for its result, and its result before the client
pays for it; a torn last line (a crash mid-write) is ignored on open. ``save`` folds the log
into the snapshot. Indices are reserved (and the snapshot written) before tasks are sent, so
a crash can leave indices unused (the next run takes them: ``client.job_records.free_indices``)
but never signs other work at an index a provider acked.

One process at a time: ``open`` takes an exclusive lock on ``deal-....lock`` (released by the
kernel if the process dies), and a second opener gets ``LedgerLocked`` at once.

The snapshot carries a schema version (``format``); older ledgers are migrated on open (the
old file is kept beside it as ``*.format<N>.bak``).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from client.errors import ClientError
from client.ledger_records import BREACHED_STATES, BatchRecord, ChainState, RunRecord, TaskRecord

FORMAT = 2
"""Schema version of the ledger snapshot. 1: v1 settlement (acks with their own deadline)."""


class LedgerError(ClientError):
    """The deal's ledger file cannot be read, or belongs to another deal."""


class LedgerFormatUnknown(LedgerError):
    """The ledger was written in a format this client does not read (a newer release's)."""


class LedgerLocked(LedgerError):
    """Another process holds the deal's ledger (one run per deal at a time)."""


@dataclass
class DealLedger:
    """What this client signed, received and paid in one deal; see the module docstring."""

    path: Path
    chain_id: int
    escrow: str
    deal_id: int
    next_index: int = 0
    last_signed: int = 0
    last_tasks: frozenset[int] = frozenset()
    voucher_delivered: bool = True  # the provider took the last voucher signed
    open_block: int | None = None
    scanned_block: int | None = None  # claims were read up to this block
    tasks: dict[int, TaskRecord] = field(default_factory=dict)
    runs: dict[int, RunRecord] = field(default_factory=dict)
    batches: dict[int, BatchRecord] = field(default_factory=dict)
    legacy_paid: dict[int, int] = field(default_factory=dict)  # migrated from format 1
    legacy_settled: set[int] = field(default_factory=set)  # migrated from format 1
    legacy_refunded: dict[int, tuple[int, int]] = field(default_factory=dict)  # from format 1
    legacy_pending: dict[int, dict[str, Any]] = field(default_factory=dict)  # v1 acks, as kept
    read_only: bool = False
    _seq: int = 0
    _lock: threading.RLock = field(default_factory=threading.RLock)
    _lock_file: Any = None
    _log: Any = None
    _closed: bool = False

    # ---- opening --------------------------------------------------------------------------

    @staticmethod
    def file_for(state_dir: Path, chain_id: int, escrow: str, deal_id: int) -> Path:
        """Return the snapshot path of a deal's ledger."""
        return state_dir / f"deal-{chain_id}-{escrow.lower()}-{deal_id}.json"

    @classmethod
    def open(
        cls,
        state_dir: Path,
        chain_id: int,
        escrow: str,
        deal_id: int,
        *,
        lock: bool = True,
    ) -> DealLedger:
        """Load the deal's ledger from ``state_dir`` (or start an empty one) and lock it.

        Raise ``LedgerLocked`` at once if another process holds the deal. With
        ``lock=False`` the ledger is read-only: it is read, never written.
        """
        path = cls.file_for(state_dir, chain_id, escrow, deal_id)
        ledger = cls(
            path=path, chain_id=chain_id, escrow=escrow.lower(), deal_id=deal_id, read_only=not lock
        )
        if lock:
            ledger._take_lock()
        try:
            ledger._load()
            if lock:
                ledger._log = ledger._log_path.open("a")
                ledger.save()  # fold the log in: a torn last line never precedes a new one
        except BaseException:
            ledger.close()
            raise
        return ledger

    @property
    def _log_path(self) -> Path:
        return self.path.with_suffix(".log")

    @property
    def results_dir(self) -> Path:
        """Return the folder where delivered outputs are kept."""
        return self.path.with_suffix(".results")

    def _take_lock(self) -> None:
        lock_path = self.path.with_suffix(".lock")
        try:
            lock_path.parent.mkdir(parents=True, exist_ok=True)
            handle = lock_path.open("a+")
        except OSError as exc:
            raise LedgerError(f"cannot open the deal lock {lock_path}: {exc}") from exc
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = handle.read().strip() or "another process"
            handle.close()
            raise LedgerLocked(
                f"deal {self.deal_id} is in use by {holder} (one run per deal at a time; "
                f"lock file {lock_path})"
            ) from None
        handle.seek(0)
        handle.truncate()
        handle.write(f"process {os.getpid()}")
        handle.flush()
        self._lock_file = handle

    def close(self) -> None:
        """Stop writing (later records are dropped) and release the deal's lock."""
        with self._lock:
            self._closed = True
            if self._log is not None:
                self._log.close()
                self._log = None
            if self._lock_file is not None:
                with contextlib.suppress(OSError):
                    fcntl.flock(self._lock_file.fileno(), fcntl.LOCK_UN)
                self._lock_file.close()
                self._lock_file = None

    def __enter__(self) -> DealLedger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _load(self) -> None:
        if self.path.exists():
            try:
                data = json.loads(self.path.read_text())
            except (OSError, ValueError) as exc:
                raise LedgerError(f"cannot read the deal ledger {self.path}: {exc}") from exc
            version = data.get("format") if isinstance(data, dict) else None
            if version == 1:
                data = self._migrate_format1(data)
            elif version != FORMAT:
                raise LedgerFormatUnknown(
                    f"{self.path}: ledger format {version!r} is not one this client reads "
                    f"(format {FORMAT} and older); a newer tpumarket wrote it"
                )
            self._read_snapshot(data)
        self._replay_log()

    def _read_snapshot(self, data: dict[str, Any]) -> None:
        try:
            if (data["chain_id"], data["escrow"], data["deal_id"]) != (
                self.chain_id,
                self.escrow,
                self.deal_id,
            ):
                raise LedgerError(f"{self.path} belongs to another deal")
            self._seq = int(data.get("seq", 0))
            self.next_index = int(data["next_index"])
            self.last_signed = int(data["last_signed"])
            self.last_tasks = frozenset(int(i) for i in data.get("last_tasks", []))
            self.voucher_delivered = bool(data.get("voucher_delivered", True))
            self.open_block = data.get("open_block")
            self.scanned_block = data.get("scanned_block")
            self.tasks = {int(t["index"]): TaskRecord.from_json(t) for t in data.get("tasks", [])}
            self.runs = {
                int(r["run"]): RunRecord(int(r["run"]), float(r["started_at"]), bool(r["finished"]))
                for r in data.get("runs", [])
            }
            self.batches = {
                int(b["batch"]): BatchRecord.from_json(b) for b in data.get("batches", [])
            }
            self.legacy_paid = {int(k): int(v) for k, v in data.get("legacy_paid", {}).items()}
            self.legacy_settled = {int(i) for i in data.get("legacy_settled", [])}
            self.legacy_refunded = {
                int(k): (int(a), int(b)) for k, (a, b) in data.get("legacy_refunded", {}).items()
            }
            self.legacy_pending = {
                int(k): dict(v) for k, v in data.get("legacy_pending", {}).items()
            }
        except (ValueError, KeyError, TypeError) as exc:
            raise LedgerError(f"cannot read the deal ledger {self.path}: {exc}") from exc

    def _migrate_format1(self, data: dict[str, Any]) -> dict[str, Any]:
        """Turn a format-1 ledger (v1 settlement) into format 2; keep the old file aside.

        Paid amounts and the last voucher carry over; tasks settled on chain stay settled, with
        the amounts refunded. The v1 acks of pending tasks cannot be refunded under v2 (they
        name no request): they are kept as written, with their signatures, in ``legacy_pending``.
        """
        backup = self.path.with_suffix(".format1.bak")
        try:
            if not self.read_only:  # the migrated snapshot replaces it on open: keep the old one
                shutil.copyfile(self.path, backup)
            paid = {str(int(k)): int(v) for k, v in data["paid"].items()}
            settled = sorted({int(i) for i in data["claimed"]} | {int(k) for k in data["refunded"]})
            return {
                "format": FORMAT,
                "chain_id": data["chain_id"],
                "escrow": data["escrow"],
                "deal_id": data["deal_id"],
                "seq": 0,
                "next_index": int(data["next_index"]),
                "last_signed": int(data["last_signed"]),
                "last_tasks": sorted(int(k) for k in paid),
                "legacy_paid": paid,
                "legacy_settled": settled,
                "legacy_refunded": {
                    str(int(k)): [int(a), int(b)] for k, (a, b) in data["refunded"].items()
                },
                "legacy_pending": {str(int(k)): dict(v) for k, v in data["pending"].items()},
            }
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            raise LedgerError(f"cannot migrate the format-1 ledger {self.path}: {exc}") from exc

    def _replay_log(self) -> None:
        try:
            text = self._log_path.read_text() if self._log_path.exists() else ""
        except OSError as exc:
            raise LedgerError(f"cannot read the deal log {self._log_path}: {exc}") from exc
        # Text after the last newline is a line torn by a crash mid-append: its change was
        # never acknowledged to anyone, so it is dropped.
        complete = text.split("\n")[:-1]
        for number, line in enumerate(complete, 1):
            try:
                entry = json.loads(line)
                seq = int(entry["seq"])
                record = TaskRecord.from_json(entry["task"])
            except (ValueError, KeyError, TypeError) as exc:
                raise LedgerError(f"{self._log_path}:{number}: corrupt entry: {exc}") from exc
            if seq > self._seq:
                self.tasks[record.index] = record
                self._seq = seq

    # ---- reading ----------------------------------------------------------------------------

    @property
    def paid(self) -> dict[int, int]:
        """Return the amount of every task a voucher pays, by index."""
        with self._lock:
            out = dict(self.legacy_paid)
            out.update({i: t.amount for i, t in self.tasks.items() if t.payable})
            return out

    @property
    def settled_elsewhere(self) -> set[int]:
        """Return tasks settled on chain without a voucher (claimed or refunded)."""
        with self._lock:
            return set(self.legacy_settled) | {
                i
                for i, t in self.tasks.items()
                if t.chain in (ChainState.CLAIMED, ChainState.REFUNDED)
            }

    @property
    def pending(self) -> dict[int, TaskRecord]:
        """Return acked tasks not verified and not settled on chain: refundable in time."""
        with self._lock:
            return {
                i: t
                for i, t in self.tasks.items()
                if t.state in BREACHED_STATES and t.chain is None and t.ack is not None
            }

    @property
    def refunded(self) -> dict[int, tuple[int, int]]:
        """Return (refund, penalty) of every task refunded on chain, by index."""
        with self._lock:
            out = dict(self.legacy_refunded)
            out.update({i: t.refund for i, t in self.tasks.items() if t.refund is not None})
            return out

    def unfinished_runs(self) -> list[int]:
        """Return the runs that never reached their report (a crash or a double Ctrl-C)."""
        with self._lock:
            return sorted(r.run for r in self.runs.values() if not r.finished)

    def outputs_of(self, index: int) -> bytes | None:
        """Return a task's saved outputs, if any."""
        record = self.tasks.get(index)
        if record is None or record.outputs is None:
            return None
        try:
            return (self.results_dir / record.outputs).read_bytes()
        except OSError:
            return None

    # ---- writing ----------------------------------------------------------------------------

    def _check_writable(self) -> None:
        if self.read_only:
            raise LedgerError(f"the ledger of deal {self.deal_id} was opened read-only")

    def start_run(self) -> int:
        """Record a new run of the deal; return its id."""
        with self._lock:
            self._check_writable()
            run = max(self.runs, default=0) + 1
            self.runs[run] = RunRecord(run, time.time())
            self.save()
            return run

    def finish_run(self, run: int) -> None:
        """Record that a run reached its report."""
        with self._lock:
            if run in self.runs:
                self.runs[run] = replace(self.runs[run], finished=True)
            self.save()

    def reserve(self, count: int) -> int:
        """Reserve ``count`` task indices, write the ledger, and return the first."""
        with self._lock:
            self._check_writable()
            first = self.next_index
            self.next_index += count
            self.save()
            return first

    def put(self, record: TaskRecord) -> TaskRecord:
        """Record a task's new state durably (one fsync'd log line); return it.

        After ``close`` the record is kept in memory only: a second Ctrl-C stops the run, and
        whatever a worker learns afterwards is learnt again by the next run.
        """
        with self._lock:
            self.tasks[record.index] = record
            if self._log is None or self._closed or self.read_only:
                return record
            self._seq += 1
            line = json.dumps({"seq": self._seq, "task": record.to_json()}, sort_keys=True)
            try:
                self._log.write(line + "\n")
                self._log.flush()
                os.fsync(self._log.fileno())
            except OSError as exc:
                raise LedgerError(f"cannot write the deal log {self._log_path}: {exc}") from exc
            return record

    def update(self, index: int, **changes: Any) -> TaskRecord:
        """Change fields of a task's record and record it durably; return the new record."""
        with self._lock:
            return self.put(replace(self.tasks[index], **changes))

    def save_outputs(self, index: int, data: bytes) -> str:
        """Write a task's delivered outputs durably; return the file name to record."""
        name = f"task-{index}.out"
        self._check_writable()
        _write_atomic(self.results_dir / name, data)
        return name

    def set_batch(self, record: BatchRecord) -> None:
        """Record a claimed batch and the client's verdict."""
        with self._lock:
            self.batches[record.batch] = record

    def save(self) -> None:
        """Write the snapshot atomically and fold the log into it."""
        with self._lock:
            if self._closed or self.read_only:
                return
            data: dict[str, Any] = {
                "format": FORMAT,
                "chain_id": self.chain_id,
                "escrow": self.escrow,
                "deal_id": self.deal_id,
                "seq": self._seq,
                "next_index": self.next_index,
                "last_signed": self.last_signed,
                "last_tasks": sorted(self.last_tasks),
                "voucher_delivered": self.voucher_delivered,
                "open_block": self.open_block,
                "scanned_block": self.scanned_block,
                "tasks": [t.to_json() for _, t in sorted(self.tasks.items())],
                "runs": [
                    {"run": r.run, "started_at": r.started_at, "finished": r.finished}
                    for _, r in sorted(self.runs.items())
                ],
                "batches": [b.to_json() for _, b in sorted(self.batches.items())],
                "legacy_paid": {str(k): v for k, v in sorted(self.legacy_paid.items())},
                "legacy_settled": sorted(self.legacy_settled),
                "legacy_refunded": {
                    str(k): list(v) for k, v in sorted(self.legacy_refunded.items())
                },
                "legacy_pending": {str(k): v for k, v in sorted(self.legacy_pending.items())},
            }
            try:
                _write_atomic(self.path, json.dumps(data, indent=1).encode())
                if self._log is not None:
                    self._log.truncate(0)
                    self._log.flush()
                    os.fsync(self._log.fileno())
            except OSError as exc:
                raise LedgerError(f"cannot write the deal ledger {self.path}: {exc}") from exc


def _write_atomic(path: Path, data: bytes) -> None:
    """Replace ``path`` with ``data``: temporary file, fsync, rename, fsync of the folder."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(path.name + ".tmp")
    with temporary.open("wb") as out:
        out.write(data)
        out.flush()
        os.fsync(out.fileno())
    os.replace(temporary, path)
    folder = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(folder)
    finally:
        os.close(folder)
