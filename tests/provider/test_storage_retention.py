"""Retention of task data in the journal: nothing still needed is pruned, everything settled is.

Real SQLite journals written through the journal's own API, deal histories drawn by
hypothesis (deliveries, a redeemed voucher, refunds, claims finalized, rejected, pending or
disputed, a close), the ``verify-journal`` check, and a process killed with SIGKILL inside a
prune's transaction.
"""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from contracts.messages import (
    KIND_INFERENCE,
    Ack,
    Domain,
    TaskRequest,
    Voucher,
    address_of,
    task_bitmap,
)
from contracts.pricing import flat
from programs.envelope import ProducerVersions, ProgramEnvelope, encode_envelope
from provider.errors import JournalError
from provider.journal import AckRecord, Journal, OutputsPrunedError
from provider.journal.command import verify_journal
from provider.output_memory import OutputMemory
from provider.receipts import build_receipt
from tests import processes

REPO = Path(__file__).resolve().parents[2]
KEY = "0x" + "11" * 32
PROVIDER = address_of(KEY)
DOMAIN = Domain(chain_id=31337, verifying_contract="0x" + "22" * 20)
PLAN = flat(compile_price=1_000, inference_price=500)


def envelope(deal_id: int, index: int, program: bytes = b"p" * 4_000) -> bytes:
    """An envelope whose program is shared by every task, its inputs its own."""
    return encode_envelope(
        ProgramEnvelope.create(
            program=program,
            inputs=b"inputs-%d-%d" % (deal_id, index) * 50,
            producer=ProducerVersions(jax="0.10.2", jaxlib="0.10.2", calling_convention=9),
            platforms=("cpu",),
            weights=b"w" * 2_000,
        )
    )


def acknowledge(journal: Journal, deal_id: int, index: int, body: bytes) -> AckRecord:
    request = TaskRequest(
        deal_id=deal_id,
        task_index=index,
        kind=KIND_INFERENCE,
        program_hash=b"\x01" * 32,
        input_hash=b"\x02" * 32,
        max_price=900,
        deadline=1_000,
    )
    ack = Ack(deal_id=deal_id, task_index=index, request_hash=request.struct_hash(), price=500)
    record = AckRecord(
        request, b"\x00" * 65, request.struct_hash(), None, ack, ack.sign(DOMAIN, KEY), 1.0
    )
    journal.record_ack(record, body)
    return record


def deliver(journal: Journal, record: AckRecord, outputs: bytes) -> None:
    deal_id = record.key[0]
    with journal.lock:
        receipt = build_receipt(
            PLAN,
            record.request,
            deadline=record.request.deadline,
            outputs=outputs,
            status=0,
            device_ms=1,
            compile_ms=0,
            cache_hit=False,
            started_at=1,
            finished_at=2,
            prev_receipt_hash=journal.next_prev_hash(deal_id),
        )
        journal.record_receipt(receipt, receipt.sign(DOMAIN, KEY), outputs, {"state": "ok"})


def open_journal(path: Path) -> Journal:
    return Journal(path, PROVIDER, DOMAIN, private_key=KEY)


# ---- a deal's history, drawn -------------------------------------------------------------

CLAIM_ENDS = ("pending", "disputed", "finalize", "rejected")


@dataclass(frozen=True)
class History:
    """One deal's tasks and what the chain did with them."""

    outputs: tuple[bytes, ...]  # per task index
    delivered: frozenset[int]
    vouched: frozenset[int]  # covered by the redeemed voucher
    refunded: frozenset[int]
    claims: tuple[tuple[frozenset[int], str], ...]  # tasks, how the claim ended (or not)
    closed: bool

    def released(self) -> set[int]:
        """Tasks nothing can need any more: delivered and settled, or the deal closed."""
        if self.closed:
            return set(self.delivered)
        ended = {i for tasks, end in self.claims if end in ("finalize", "rejected") for i in tasks}
        return set(self.delivered) & (self.vouched | self.refunded | ended)


@st.composite
def histories(draw: st.DrawFn) -> History:
    count = draw(st.integers(1, 8))
    outputs = tuple(draw(st.binary(min_size=0, max_size=300)) for _ in range(count))
    delivered = frozenset(draw(st.sets(st.integers(0, count - 1))))
    fate = {i: draw(st.sampled_from(("open", "vouched", "refunded", "claim"))) for i in delivered}
    claimed = sorted(i for i, f in fate.items() if f == "claim")
    claims: list[tuple[frozenset[int], str]] = []
    while claimed:
        size = draw(st.integers(1, len(claimed)))
        claims.append((frozenset(claimed[:size]), draw(st.sampled_from(CLAIM_ENDS))))
        claimed = claimed[size:]
    pending_claims = any(end in ("pending", "disputed") for _, end in claims)
    return History(
        outputs=outputs,
        delivered=delivered,
        vouched=frozenset(i for i, f in fate.items() if f == "vouched"),
        refunded=frozenset(i for i, f in fate.items() if f == "refunded"),
        claims=tuple(claims),
        # the escrow closes a deal only once no claim is pending or disputed
        closed=not pending_claims and draw(st.booleans()),
    )


def live(journal: Journal, deal_id: int, history: History) -> dict[int, bytes]:
    """Write the history through the journal's API; return each task's envelope."""
    bodies = {}
    for index, outputs in enumerate(history.outputs):
        bodies[index] = envelope(deal_id, index)
        record = acknowledge(journal, deal_id, index, bodies[index])
        if index in history.delivered:
            deliver(journal, record, outputs)
    if history.vouched:
        voucher = journal.record_voucher(
            Voucher(deal_id, 500 * len(history.vouched), task_bitmap(sorted(history.vouched))),
            b"\x00" * 65,
        )
        journal.record_settlement(deal_id, "redeem", {"voucher_seq": voucher.seq}, "0x01")
    if history.refunded:
        journal.record_settlement(deal_id, "refunded", {"tasks": sorted(history.refunded)}, None)
    for batch, (tasks, end) in enumerate(history.claims):
        claim = {"tasks": sorted(tasks), "batch_id": batch, "deadline": 1, "amount": "500"}
        journal.record_settlement(deal_id, "claim", claim, "0x02")
        if end in ("finalize", "rejected"):
            journal.record_settlement(deal_id, end, {"batch_id": batch, "amount": "500"}, None)
    if history.closed:
        journal.record_settlement(deal_id, "closed", {"by": "provider"}, "0x03")
    return bodies


def check_retention(
    journal: Journal, deal_id: int, history: History, bodies: dict[int, bytes]
) -> None:
    released = history.released()
    kept_bytes = 0
    for index, body in bodies.items():
        key = (deal_id, index)
        if index in released:
            assert journal.is_pruned(key)
            with pytest.raises(OutputsPrunedError):
                journal.outputs(key)
            with pytest.raises(JournalError, match="pruned"):
                journal.envelope(key)
            continue
        assert not journal.is_pruned(key)
        assert journal.envelope(key) == body  # an undelivered task can still be re-run
        kept_bytes += len(body)
        if index in history.delivered:  # delivery, a voucher, a claim or a dispute needs them
            assert journal.outputs(key) == history.outputs[index]
            kept_bytes += len(history.outputs[index])
    assert journal.stored_bytes(deal_id) == kept_bytes


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(st.lists(histories(), min_size=1, max_size=3))
def test_retention_prunes_settled_task_data_and_never_what_is_still_needed(
    deals: list[History],
) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "journal.sqlite3"
        journal = open_journal(path)
        try:
            bodies = {d: live(journal, d, h) for d, h in enumerate(deals, start=1)}
            journal.prune_settled()
            for deal_id, history in enumerate(deals, start=1):
                check_retention(journal, deal_id, history, bodies[deal_id])
            assert journal.prune_settled() == {}  # nothing left to do: idempotent
        finally:
            journal.close()
        reopened = open_journal(path)  # sealing at open prunes nothing more
        try:
            for deal_id, history in enumerate(deals, start=1):
                check_retention(reopened, deal_id, history, bodies[deal_id])
        finally:
            reopened.close()
        report = verify_journal(path, PROVIDER)
        assert report.ok, report.problems
        with sqlite3.connect(path) as db:  # the shared program and weights: while referenced
            blobs = db.execute("SELECT COUNT(*) FROM blobs").fetchone()[0]
        retained = sum(len(h.outputs) - len(h.released()) for h in deals)
        assert blobs == (2 if retained else 0)


def test_retention_when_settled_then_disk_pages_are_reused_not_grown(tmp_path: Path) -> None:
    path = tmp_path / "journal.sqlite3"
    journal = open_journal(path)
    try:
        for deal_id in range(1, 41):
            history = History(
                outputs=(b"x" * 200_000,) * 2,
                delivered=frozenset({0, 1}),
                vouched=frozenset({0, 1}),
                refunded=frozenset(),
                claims=(),
                closed=False,
            )
            live(journal, deal_id, history)
            if deal_id == 10:
                with sqlite3.connect(path) as db:
                    db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
                size_after_10 = path.stat().st_size
        with sqlite3.connect(path) as db:
            db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        # 30 deals more, 12 MB of outputs written and settled: the freed pages took them
        assert path.stat().st_size < size_after_10 + 1_000_000
        assert journal.stored_bytes() == 0
    finally:
        journal.close()


# ---- a kill inside the prune's transaction ------------------------------------------------

KILLED_PRUNE = """
import os, signal, sys
from pathlib import Path
from provider.journal.retention import Retention
from tests.provider.test_storage_retention import open_journal

real = Retention._drop_unreferenced_blob
calls = [0]

def dying(self, sha):
    calls[0] += 1
    if calls[0] == int(sys.argv[2]):  # task rows inserted and deleted, not committed
        print("killing", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    return real(self, sha)

Retention._drop_unreferenced_blob = dying
open_journal(Path(sys.argv[1]))  # prunes every settled deal while it opens
"""


def test_retention_when_killed_mid_prune_then_the_journal_stays_consistent(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "journal.sqlite3"
    journal = open_journal(path)
    bodies = {}
    history = History(
        outputs=(b"out-a", b"out-b", b"out-c"),
        delivered=frozenset({0, 1, 2}),
        vouched=frozenset({0, 1, 2}),
        refunded=frozenset(),
        claims=(),
        closed=False,
    )
    # settled on chain while the settlement rows could not prune (as a crash before it would)
    monkeypatch.setattr(Journal, "prune", lambda self, deal_id, indexes, reason: [])
    for deal_id in range(1, 5):
        bodies[deal_id] = live(journal, deal_id, history)
    monkeypatch.undo()
    journal.close()

    # deal 1 pruned and committed, the kill inside deal 2's transaction (2 blobs per deal)
    child = processes.spawn(
        [sys.executable, "-c", KILLED_PRUNE, str(path), "3"],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    output, _ = child.communicate()
    assert child.returncode == -9, output
    with sqlite3.connect(path) as db:
        pruned = {tuple(r) for r in db.execute("SELECT deal_id, task_index FROM pruned")}
        data = {tuple(r) for r in db.execute("SELECT DISTINCT deal_id, task_index FROM task_data")}
    assert pruned == {("1", i) for i in range(3)}  # all of deal 1, nothing of deal 2
    assert data == {(str(d), i) for d in (2, 3, 4) for i in range(3)}

    reopened = open_journal(path)  # the next open prunes the rest
    try:
        for deal_id in range(1, 5):
            check_retention(reopened, deal_id, history, bodies[deal_id])
        assert reopened.prune_settled() == {}
        assert reopened.stored_bytes() == 0
    finally:
        reopened.close()
    report = verify_journal(path, PROVIDER)
    assert report.ok, report.problems


def test_verify_journal_when_kept_outputs_are_changed_then_the_task_fails(tmp_path: Path) -> None:
    path = tmp_path / "journal.sqlite3"
    journal = open_journal(path)
    try:
        for index in (0, 1):
            deliver(journal, acknowledge(journal, 1, index, envelope(1, index)), b"out-%d" % index)
    finally:
        journal.close()
    assert verify_journal(path, PROVIDER).ok
    with sqlite3.connect(path) as db:  # task data is not append-only: no trigger to go around
        db.execute("UPDATE task_data SET data = X'00' WHERE part = 'outputs' AND task_index = 1")
    report = verify_journal(path, PROVIDER)
    assert report.problems == ["deal 1 task 1: outputs differ from their receipt"]


def test_outputs_in_memory_when_their_task_is_pruned_then_dropped_too(tmp_path: Path) -> None:
    memory = OutputMemory(1_000_000)
    journal = open_journal(tmp_path / "journal.sqlite3")
    try:
        journal.on_prune(memory.discard)
        for index in (0, 1):
            deliver(journal, acknowledge(journal, 1, index, envelope(1, index)), b"out-%d" % index)
            memory.put((1, index), b"out-%d" % index)
        voucher = journal.record_voucher(Voucher(1, 500, task_bitmap([0])), b"\x00" * 65)
        journal.record_settlement(1, "redeem", {"voucher_seq": voucher.seq}, "0x01")
        assert memory.get((1, 0)) is None and memory.get((1, 1)) == b"out-1"
        assert memory.held_bytes == len(b"out-1")
    finally:
        journal.close()
