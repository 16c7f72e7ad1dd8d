"""Checking the journal: receipt chains, hashes and signatures, and the seals of closed deals.

Receipts chain per deal: each receipt's ``prevReceiptHash`` is the EIP-712 struct hash of the
deal's previous receipt (zero for the first). A deal is checked either from its in-memory book
(:func:`verify_book`, the open deals at every open) or streamed from the database one row at a
time (:func:`summarize_deal`): the latter also sums the deal's rows into a
:class:`DealSummary` (counts, totals, chain head and a digest of every row), which is what a
seal signs and what :func:`verify_all` compares each seal against. Memory stays constant
whatever the journal's size: one deal's running sums at a time.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from contracts.errors import SignatureError
from contracts.hashing import keccak256
from contracts.messages import ZERO_HASH, Domain, Receipt, recover_digest
from provider.errors import JournalCorruptError
from provider.journal.records import PROTOCOL, DealBook

_PAGE = 1000  # deals read per query by a full verification
SEAL_PREFIX = b"tpumarket journal seal v1\n"
"""Prefixed to a checkpoint's JSON before hashing: a seal's digest is no EIP-712 digest."""

# Every stored column of a deal's rows, in a fixed order: the row digest covers them all.
_ROWS = (
    (
        "acks",
        "task_index, request_json, request_sig, request_hash, target, envelope, ack_json, "
        "ack_sig, acked_at, program_sha256, weights_sha256, protocol",
        "task_index",
    ),
    (
        "receipts",
        "seq, task_index, receipt_json, receipt_sig, receipt_hash, outputs, detail_json, "
        "recorded_at",
        "seq",
    ),
    ("vouchers", "seq, voucher_json, signature, received_at", "seq"),
    ("settlements", "seq, action, data_json, tx_hash, recorded_at", "seq"),
)


def receipt_digest(struct_hash: bytes, domain: Domain, protocol: int = PROTOCOL) -> bytes:
    """Return the digest of a receipt (given its struct hash) under the domain version of the
    protocol it was signed in."""
    if protocol != PROTOCOL:
        domain = replace(domain, version=str(protocol))
    return keccak256(b"\x19\x01" + domain.separator() + struct_hash)


def _check_receipt(
    where: str,
    receipt: Receipt,
    signature: bytes,
    stored_hash: bytes,
    previous: bytes,
    ack_deadline: int | None,
    protocol: int,
    provider: str,
    domain: Domain,
) -> None:
    if receipt.prev_receipt_hash != previous:
        raise JournalCorruptError(f"{where}: receipt chain broken")
    if receipt.struct_hash() != stored_hash:
        raise JournalCorruptError(f"{where}: stored hash differs from receipt")
    # the stored hash is the receipt's now: its digest needs no second struct hash
    if ack_deadline is None:
        raise JournalCorruptError(f"{where}: receipt without an ack")
    if receipt.deadline != ack_deadline:
        raise JournalCorruptError(f"{where}: receipt deadline differs from request")
    try:
        signer = recover_digest(receipt_digest(stored_hash, domain, protocol), signature)
    except SignatureError as exc:
        raise JournalCorruptError(f"{where}: bad receipt signature") from exc
    if signer.lower() != provider.lower():
        raise JournalCorruptError(f"{where}: receipt signed by {signer}")


def verify_book(deal_id: int, book: DealBook, provider: str, domain: Domain) -> int:
    """Check a deal's receipt chain from its book; return the receipts checked.

    Raise :class:`JournalCorruptError` on a broken link, a hash that does not match its
    receipt, a receipt not signed by ``provider``, or a receipt without an ack.
    """
    previous = ZERO_HASH
    checked = 0
    for record in sorted(book.receipts.values(), key=lambda r: r.seq):
        ack = book.acks.get(record.receipt.task_index)
        _check_receipt(
            f"deal {deal_id} task {record.receipt.task_index}",
            record.receipt,
            record.signature,
            record.receipt_hash,
            previous,
            None if ack is None else ack.request.deadline,
            PROTOCOL if ack is None else ack.protocol,
            provider,
            domain,
        )
        previous = record.receipt_hash
        checked += 1
    if previous != book.last_receipt_hash:
        raise JournalCorruptError(f"deal {deal_id}: chain head mismatch")
    return checked


@dataclass(frozen=True, slots=True)
class DealSummary:
    """A deal's rows summed up: what a seal signs (its checkpoint)."""

    deal_id: int
    provider: str
    chain_id: int
    escrow: str
    acks: int = 0
    ack_total: int = 0
    receipts: int = 0
    receipt_total: int = 0
    chain_head: str = "0x" + ZERO_HASH.hex()
    vouchers: int = 0
    voucher_cumulative: int = 0
    settlements: int = 0
    rows_sha256: str = field(default="")

    def to_json(self) -> dict[str, Any]:
        """Return the checkpoint as JSON (amounts as decimal strings)."""
        out = asdict(self)
        for name in ("ack_total", "receipt_total", "voucher_cumulative"):
            out[name] = str(out[name])
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> DealSummary:
        """Parse a checkpoint written by :meth:`to_json`."""
        values = dict(data)
        for name in ("ack_total", "receipt_total", "voucher_cumulative"):
            values[name] = int(values[name])
        return cls(**values)

    def canonical(self) -> str:
        """Return the JSON text a seal stores and signs."""
        return json.dumps(self.to_json(), sort_keys=True, separators=(",", ":"))

    def seal_digest(self) -> bytes:
        """Return the digest the provider signs to seal this checkpoint."""
        return keccak256(SEAL_PREFIX + self.canonical().encode())


def _rows(db: sqlite3.Connection, which: int, deal: str) -> Iterator[Any]:
    table, columns, order = _ROWS[which]
    return iter(
        db.execute(f"SELECT {columns} FROM {table} WHERE deal_id = ? ORDER BY {order}", (deal,))
    )


def summarize_deal(
    db: sqlite3.Connection, deal_id: int, provider: str, domain: Domain
) -> DealSummary:
    """Stream a deal's rows from ``db``: check its receipt chain, sum it up.

    Raise :class:`JournalCorruptError` like :func:`verify_book`.
    """
    deal = str(deal_id)
    rows = hashlib.sha256()
    acks = ack_total = 0
    rows.update(b"acks")
    for row in _rows(db, 0, deal):
        rows.update(repr(row).encode())
        acks += 1
        ack_total += int(json.loads(row[6])["price"])
    previous, receipts, receipt_total = ZERO_HASH, 0, 0
    rows.update(b"receipts")
    for row in _rows(db, 1, deal):
        rows.update(repr(row).encode())
        _, task_index, receipt_json, sig, stored_hash = row[:5]
        where = f"deal {deal_id} task {task_index}"
        try:
            receipt = Receipt.from_json(json.loads(receipt_json))
        except (ValueError, TypeError, KeyError) as exc:
            raise JournalCorruptError(f"{where}: unreadable receipt ({exc})") from exc
        if receipt.deal_id != deal_id or receipt.task_index != task_index:
            raise JournalCorruptError(f"{where}: receipt of another task")
        deadline, protocol = _ack_terms(db, deal, int(task_index))
        _check_receipt(
            where,
            receipt,
            bytes(sig),
            bytes(stored_hash),
            previous,
            deadline,
            protocol,
            provider,
            domain,
        )
        previous = bytes(stored_hash)
        receipts += 1
        receipt_total += receipt.amount
    vouchers = cumulative = 0
    rows.update(b"vouchers")
    for row in _rows(db, 2, deal):
        rows.update(repr(row).encode())
        vouchers += 1
        cumulative = max(cumulative, int(json.loads(row[1])["cumulative_amount"]))
    settlements = 0
    rows.update(b"settlements")
    for row in _rows(db, 3, deal):
        rows.update(repr(row).encode())
        settlements += 1
    return DealSummary(
        deal_id=deal_id,
        provider=provider,
        chain_id=domain.chain_id,
        escrow=domain.verifying_contract,
        acks=acks,
        ack_total=ack_total,
        receipts=receipts,
        receipt_total=receipt_total,
        chain_head="0x" + previous.hex(),
        vouchers=vouchers,
        voucher_cumulative=cumulative,
        settlements=settlements,
        rows_sha256=rows.hexdigest(),
    )


def _ack_terms(db: sqlite3.Connection, deal: str, index: int) -> tuple[int | None, int]:
    """Return (request deadline, protocol) of an ack row, (None, v2) when there is none."""
    row = db.execute(
        "SELECT request_json, ack_json, protocol FROM acks WHERE deal_id = ? AND task_index = ?",
        (deal, index),
    ).fetchone()
    if row is None:
        return None, PROTOCOL
    protocol = int(row[2])
    source = row[0] if protocol >= PROTOCOL else row[1]  # a v1 request has no deadline
    return int(json.loads(source)["deadline"]), protocol


def check_seal(summary: DealSummary, checkpoint_json: str, signature: bytes, provider: str) -> None:
    """Raise :class:`JournalCorruptError` unless the seal is ``provider``'s and its checkpoint
    is what the deal's rows sum up to now."""
    where = f"deal {summary.deal_id}"
    try:
        sealed = DealSummary.from_json(json.loads(checkpoint_json))
        signer = recover_digest(sealed.seal_digest(), signature)
    except (ValueError, TypeError, KeyError, SignatureError) as exc:
        raise JournalCorruptError(f"{where}: unreadable seal ({exc})") from exc
    if sealed.canonical() != checkpoint_json:
        raise JournalCorruptError(f"{where}: seal checkpoint not in its signed form")
    if signer.lower() != provider.lower():
        raise JournalCorruptError(f"{where}: seal signed by {signer}")
    if sealed != summary:
        differ = [k for k, v in summary.to_json().items() if sealed.to_json().get(k) != v]
        raise JournalCorruptError(
            f"{where}: sealed rows changed since the seal ({', '.join(differ)})"
        )


@dataclass
class VerifyReport:
    """What a full verification found: counts, and one line per deal that failed."""

    deals: int = 0
    sealed: int = 0
    receipts: int = 0
    blobs: int = 0
    problems: list[str] = field(default_factory=list)
    last_deal_rowid: int = 0

    @property
    def ok(self) -> bool:
        """Return whether nothing failed."""
        return not self.problems

    def to_json(self) -> dict[str, Any]:
        """Return the report as JSON."""
        return {
            "ok": self.ok,
            "deals": self.deals,
            "sealed": self.sealed,
            "receipts": self.receipts,
            "blobs": self.blobs,
            "problems": self.problems,
        }


def verify_deals(
    db: sqlite3.Connection,
    provider: str,
    domain: Domain,
    *,
    after_rowid: int = 0,
    limit: int | None = None,
    only_sealed: bool = False,
    progress: Callable[[VerifyReport], None] | None = None,
) -> VerifyReport:
    """Stream-check deals in the order the journal first saw them, from ``after_rowid``:
    each deal's receipt chain, and each sealed deal's seal against its rows now.

    ``limit`` bounds the deals checked (a batch of the background check); a failing deal is
    reported, not raised, and the walk goes on.
    """
    report = VerifyReport(last_deal_rowid=after_rowid)
    join = "JOIN" if only_sealed else "LEFT JOIN"
    query = (
        f"SELECT d.rowid, d.deal_id, s.checkpoint_json, s.signature FROM deals d {join} seals s "
        "ON s.deal_id = d.deal_id WHERE d.rowid > ? ORDER BY d.rowid LIMIT ?"
    )
    left = limit
    while left is None or left > 0:
        page = min(_PAGE, _PAGE if left is None else left)
        rows = db.execute(query, (report.last_deal_rowid, page)).fetchall()
        for rowid, deal, checkpoint, signature in rows:
            report.last_deal_rowid = int(rowid)
            report.deals += 1
            try:
                summary = summarize_deal(db, int(deal), provider, domain)
                report.receipts += summary.receipts
                if checkpoint is not None:
                    report.sealed += 1
                    check_seal(summary, str(checkpoint), bytes(signature), provider)
            except JournalCorruptError as exc:
                report.problems.append(str(exc))
            if progress is not None:
                progress(report)
        if len(rows) < page:
            break
        if left is not None:
            left -= len(rows)
    return report


def verify_blobs(db: sqlite3.Connection, report: VerifyReport) -> None:
    """Check every stored program and weights blob against its content hash."""
    for sha, data in db.execute("SELECT sha256, data FROM blobs"):
        report.blobs += 1
        if hashlib.sha256(bytes(data)).digest() != bytes(sha):
            report.problems.append(f"blob {bytes(sha).hex()}: content differs from its hash")


def verify_task_data(db: sqlite3.Connection, report: VerifyReport) -> None:
    """Check every kept output against the hash its receipt commits to (outputs are kept out
    of the rows a seal signs, :mod:`provider.journal.retention`)."""
    rows = db.execute(
        "SELECT t.deal_id, t.task_index, t.data, r.receipt_json FROM task_data t "
        "JOIN receipts r ON r.deal_id = t.deal_id AND r.task_index = t.task_index "
        "WHERE t.part = 'outputs'"
    )
    for deal, index, data, receipt_json in rows:
        receipt = Receipt.from_json(json.loads(receipt_json))
        if hashlib.sha256(bytes(data)).digest() != receipt.output_hash:
            report.problems.append(f"deal {deal} task {index}: outputs differ from their receipt")
