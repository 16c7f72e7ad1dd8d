"""Sealing the journal: closed and settled deals leave memory under a signed checkpoint.

Real SQLite files, the journal's own API to write them, the ``verify-journal`` command run as
the operator runs it (a process), and a process killed with SIGKILL while it seals.
"""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from contracts.messages import (
    KIND_INFERENCE,
    ZERO_ADDRESS,
    Ack,
    Domain,
    Quote,
    TaskRequest,
    Voucher,
    address_of,
    task_bitmap,
)
from contracts.pricing import flat
from provider.errors import JournalError, RejectedError
from provider.journal import SCHEMA_VERSION, AckRecord, Journal
from provider.journal.command import verify_journal
from provider.receipts import build_receipt
from tests import processes

REPO = Path(__file__).resolve().parents[2]
KEY = "0x" + "11" * 32
PROVIDER = address_of(KEY)
DOMAIN = Domain(chain_id=31337, verifying_contract="0x" + "22" * 20)
PLAN = flat(compile_price=1_000, inference_price=500)
FIXTURE_V2 = Path(__file__).parent / "fixtures" / "journal_v2.sql"


def acknowledge(journal: Journal, deal_id: int, index: int) -> AckRecord:
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
    journal.record_ack(record, b"envelope-%d-%d" % (deal_id, index))
    return record


def deliver(journal: Journal, record: AckRecord) -> None:
    deal_id, index = record.key
    with journal.lock:
        receipt = build_receipt(
            PLAN,
            record.request,
            deadline=record.request.deadline,
            outputs=b"out-%d" % index,
            status=0,
            device_ms=1,
            compile_ms=0,
            cache_hit=False,
            started_at=1,
            finished_at=2,
            prev_receipt_hash=journal.next_prev_hash(deal_id),
        )
        journal.record_receipt(
            receipt, receipt.sign(DOMAIN, KEY), b"out-%d" % index, {"state": "succeeded"}
        )


def serve(journal: Journal, deal_id: int, tasks: int, *, close: bool = True) -> None:
    """Run a deal's life through the journal: tasks delivered, vouched, redeemed, closed."""
    for index in range(tasks):
        deliver(journal, acknowledge(journal, deal_id, index))
    voucher = journal.record_voucher(
        Voucher(deal_id=deal_id, cumulative_amount=500 * tasks, tasks=task_bitmap(range(tasks))),
        b"\x00" * 65,
    )
    journal.record_settlement(
        deal_id, "redeem", {"voucher_seq": voucher.seq, "paid": str(500 * tasks)}, "0x01"
    )
    if close:
        journal.record_settlement(deal_id, "closed", {"by": "provider"}, "0x02")


def open_journal(path: Path, *, key: str | None = KEY) -> Journal:
    return Journal(path, PROVIDER, DOMAIN, private_key=key)


def tamper(path: Path, sql: str, *params: object) -> None:
    """Change a row the way an editor of the file would: around the append-only triggers."""
    db = sqlite3.connect(path)
    try:
        triggers = db.execute(
            "SELECT name, sql FROM sqlite_master WHERE type = 'trigger'"
        ).fetchall()
        for name, _ in triggers:
            db.execute(f"DROP TRIGGER {name}")
        db.execute(sql, params)
        for _, create in triggers:
            db.execute(create)
        db.commit()
    finally:
        db.close()


def test_journal_when_a_deal_closes_settled_then_it_is_sealed_and_left_out_of_memory(
    tmp_path: Path,
) -> None:
    path = tmp_path / "journal.sqlite3"
    journal = open_journal(path)
    serve(journal, 1, 3)
    serve(journal, 2, 2, close=False)  # open
    serve(journal, 3, 1)
    running = acknowledge(journal, 3, 1)  # closed on chain, one task still running
    assert journal.seal_ready() == [1]
    deliver(journal, running)
    assert journal.seal_ready() == [3]
    journal.close()

    reopened = open_journal(path)
    try:
        assert sorted(d for d, _ in reopened.iter_books()) == [2]
        assert sorted(reopened.deal_ids()) == [1, 2, 3]
        book = reopened.deal(1)
        assert book is not None and book.sealed and sorted(book.receipts) == [0, 1, 2]
        assert book.closed() and book.latest_voucher is not None
        ack = reopened.ack((1, 2))
        receipt = reopened.receipt((1, 2))
        assert ack is not None and ack.ack.price == 500
        assert receipt is not None and receipt.receipt.task_index == 2
        with pytest.raises(RejectedError, match="outputs_pruned"):  # settled: pruned
            reopened.outputs((1, 2))
        with pytest.raises(JournalError, match="pruned"):
            reopened.envelope((1, 2))
        with pytest.raises(RejectedError) as refused:
            reopened.record_voucher(
                Voucher(deal_id=1, cumulative_amount=9_999, tasks=task_bitmap([0])), b"\x00" * 65
            )
        assert refused.value.code == "deal_not_open"
        with pytest.raises(RejectedError):
            reopened.record_settlement(1, "claim", {"tasks": [0]}, None)
        with pytest.raises(RejectedError):
            acknowledge(reopened, 1, 3)
        assert reopened.deal(1) is not None and len(reopened.deal(1).vouchers) == 1  # type: ignore[union-attr]
        history = [action for action, _ in reopened.settlement_history()]
        assert history.count("closed") == 2 and history.count("redeem") == 3
    finally:
        reopened.close()
    report = verify_journal(path, PROVIDER)
    assert report.ok, report.problems
    assert (report.deals, report.sealed, report.receipts) == (3, 2, 7)


def test_journal_without_the_key_then_seals_nothing_until_opened_with_it(tmp_path: Path) -> None:
    path = tmp_path / "journal.sqlite3"
    journal = open_journal(path, key=None)
    serve(journal, 1, 2)
    assert journal.seal_ready() == []
    journal.close()
    with pytest.raises(JournalError, match="not the provider's"):
        Journal(path, PROVIDER, DOMAIN, private_key="0x" + "12" * 32)

    reopened = open_journal(path)  # a seal never written (a crash before it): sealed at open
    try:
        assert list(reopened.iter_books()) == [] and reopened.sealed(1)
    finally:
        reopened.close()


TAMPERS = {
    "receipt amount": (
        "UPDATE receipts SET receipt_json = replace(receipt_json, '\"amount\": 500', "
        "'\"amount\": 900') WHERE deal_id = '1' AND task_index = 1"
    ),
    "ack price": (
        "UPDATE acks SET ack_json = replace(ack_json, '\"price\": 500', '\"price\": 400') "
        "WHERE deal_id = '1' AND task_index = 0"
    ),
    "outputs": "UPDATE receipts SET outputs = X'00' WHERE deal_id = '1' AND task_index = 2",
    "settlement data": (
        'UPDATE settlements SET data_json = \'{"by": "client"}\' '
        "WHERE deal_id = '1' AND action = 'closed'"
    ),
    "voucher deleted": "DELETE FROM vouchers WHERE deal_id = '1'",
    "receipt deleted": "DELETE FROM receipts WHERE deal_id = '1' AND task_index = 2",
    "row added": (
        "INSERT INTO settlements (deal_id, action, data_json, tx_hash, recorded_at) "
        "VALUES ('1', 'claim', '{\"tasks\": [1]}', NULL, 0)"
    ),
    "seal edited": (
        "UPDATE seals SET checkpoint_json = replace(checkpoint_json, '\"receipts\":3', "
        "'\"receipts\":2') WHERE deal_id = '1'"
    ),
    "seal removed": "DELETE FROM seals WHERE deal_id = '1'",
}


@pytest.mark.parametrize("change", sorted(TAMPERS))
def test_verify_journal_when_a_sealed_row_is_changed_then_the_deal_fails(
    tmp_path: Path, change: str
) -> None:
    path = tmp_path / "journal.sqlite3"
    journal = open_journal(path)
    serve(journal, 1, 3)
    serve(journal, 2, 2)
    assert journal.seal_ready() == [1, 2]
    journal.close()

    tamper(path, TAMPERS[change])

    if change == "seal removed":  # the deal is open again: loaded and verified at open
        reopened = open_journal(path, key=None)
        assert [d for d, _ in reopened.iter_books()] == [1]
        reopened.close()
        return
    reopened = open_journal(path)  # sealed rows are not read at open: it opens
    assert list(reopened.iter_books()) == []
    reopened.close()
    report = verify_journal(path, PROVIDER)
    assert not report.ok and len(report.problems) == 1
    assert report.problems[0].startswith("deal 1:") or report.problems[0].startswith("deal 1 ")


def test_verify_journal_command_when_run_then_exit_status_says_whether_it_verifies(
    tmp_path: Path,
) -> None:
    path = tmp_path / "journal.sqlite3"
    journal = open_journal(path)
    serve(journal, 1, 2)
    serve(journal, 2, 1, close=False)
    journal.seal_ready()
    journal.close()
    command = [
        *(sys.executable, "-m", "provider.cli", "verify-journal", "--quiet"),
        *("--journal", str(path), "--provider", PROVIDER),
    ]

    good = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert good.returncode == 0, good.stderr
    assert '"ok": true' in good.stdout and '"sealed": 1' in good.stdout

    tamper(path, TAMPERS["receipt amount"])
    bad = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert bad.returncode == 1, bad.stderr
    assert "deal 1 task 1: stored hash differs from receipt" in bad.stdout

    missing = subprocess.run(
        [*command[:6], str(tmp_path / "none.sqlite3"), *command[7:]],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert missing.returncode == 2 and "no journal at" in missing.stderr


def test_background_check_when_run_in_batches_then_covers_every_sealed_deal_and_starts_over(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "journal.sqlite3"
    journal = open_journal(path)
    for deal_id in (1, 2, 3):
        serve(journal, deal_id, 1)
    serve(journal, 4, 1, close=False)
    assert journal.seal_ready() == [1, 2, 3]
    journal.close()
    tamper(
        path, TAMPERS["outputs"].replace("task_index = 2", "task_index = 0").replace("'1'", "'3'")
    )

    reopened = open_journal(path)
    try:
        first = reopened.verify_sealed_batch(limit=2)
        with caplog.at_level("ERROR", logger="provider.journal"):
            second = reopened.verify_sealed_batch(limit=2)
        third = reopened.verify_sealed_batch(limit=2)
    finally:
        reopened.close()
    assert (first.deals, first.ok) == (2, True)
    assert (second.deals, second.ok) == (1, False) and "deal 3:" in second.problems[0]
    assert "sealed deal fails verification" in caplog.text
    assert third.deals == 2  # started over


def test_journal_of_schema_v2_when_opened_then_migrated_and_its_closed_deal_sealed(
    tmp_path: Path,
) -> None:
    path = tmp_path / "journal.sqlite3"
    db = sqlite3.connect(path)
    db.executescript(FIXTURE_V2.read_text())
    db.close()

    journal = open_journal(path)
    try:
        assert journal.migrated_from == 2 and journal.schema_version() == SCHEMA_VERSION
        assert journal.sealed(5) and not journal.sealed(6)
        assert [d for d, _ in journal.iter_books()] == [6]
        assert [a.key for a in journal.unfinished()] == [(6, 1)]
        assert journal.envelope((6, 1)) == b"envelope-6-1"
        assert journal.meta("deal_scan_block") == "42"
        sealed = journal.deal(5)
        assert sealed is not None and sealed.sealed and len(sealed.receipts) == 3
        assert sealed.opened() is not None and sealed.redeemed() is not None
        assert journal.outputs((5, 2)) == b"out-2"
        deliver(journal, journal.unfinished()[0])  # the open deal goes on
    finally:
        journal.close()
    report = verify_journal(path, PROVIDER)
    assert report.ok and (report.deals, report.sealed, report.receipts) == (2, 1, 5)


SEAL_AT_OPEN = """
import sys
from pathlib import Path
from tests.provider.test_journal_sealing import open_journal
open_journal(Path(sys.argv[1]))  # seals every closed deal while it opens
"""


def test_journal_when_killed_while_sealing_then_reopens_whole_and_seals_the_rest(
    tmp_path: Path,
) -> None:
    path = tmp_path / "journal.sqlite3"
    journal = open_journal(path, key=None)  # closed deals, no seal yet
    deals = 120
    for deal_id in range(1, deals + 1):
        serve(journal, deal_id, 3)
    journal.close()

    sealer = processes.spawn([sys.executable, "-c", SEAL_AT_OPEN, str(path)], cwd=REPO)
    try:
        reader = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=30)
        sealed_before = 0
        while sealed_before == 0 and sealer.poll() is None:  # wait for the first seals
            sealed_before = reader.execute("SELECT COUNT(*) FROM seals").fetchone()[0]
        reader.close()
    finally:
        sealer.kill()  # SIGKILL: mid-transaction or between two seals
        sealer.wait()

    reopened = open_journal(path)
    try:
        assert list(reopened.iter_books()) == []
        assert all(reopened.sealed(d) for d in range(1, deals + 1))
    finally:
        reopened.close()
    report = verify_journal(path, PROVIDER)
    assert report.ok, report.problems
    assert (report.deals, report.sealed, report.receipts) == (deals, deals, 3 * deals)


def test_quotes_when_asked_for_those_valid_at_an_instant_then_only_live_ones_are_read(
    tmp_path: Path,
) -> None:
    journal = open_journal(tmp_path / "journal.sqlite3")
    try:
        for n, valid_until in enumerate((100, 200, 300)):
            quote = Quote(
                provider=PROVIDER,
                client=ZERO_ADDRESS,
                arbiter=ZERO_ADDRESS,
                max_spend=10**9,
                stake=10**6,
                penalty=1,
                duration=3_600,
                challenge_window=60,
                slo_ms=100,
                valid_until=valid_until,
                nonce=n,
                plan=PLAN,
            )
            journal.record_quote(f"tpu:{n % 2}", quote, quote.sign(DOMAIN, KEY))
        assert [q.quote.valid_until for q in journal.quotes(valid_at=200)] == [200, 300]
        assert [q.quote.valid_until for q in journal.quotes("tpu:0", valid_at=150)] == [300]
        assert [q.quote.nonce for q in journal.quotes("tpu:0")] == [0, 2]
        assert len(journal.quotes()) == 3
    finally:
        journal.close()
