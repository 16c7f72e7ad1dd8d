"""Ledgers written by earlier releases open with the current code, every entry kept, and are
rewritten in the current format; a ledger of a newer format is refused.

The fixtures under ``ledgers/`` are files as those releases wrote them: ``format1`` (v1
settlement: paid amounts, claims, refunds and the v1 acks of pending tasks) and ``format2``
(snapshot, log and saved outputs: acks, receipts, outputs' references, the last voucher, a
claimed batch, a refund, and one record that only the log holds).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from client.ledger import FORMAT, DealLedger, LedgerError, LedgerFormatUnknown
from client.ledger_records import ChainState, TaskState
from client.vouchers import VoucherBook

FIXTURES = Path(__file__).parent / "ledgers"
ESCROW = "0x" + "ab" * 20


def _copy(release: str, to: Path) -> Path:
    shutil.copytree(FIXTURES / release, to, dirs_exist_ok=True)
    return DealLedger.file_for(to, 31337, ESCROW, 4)


def test_ledger_of_format_1_opens_keeps_every_entry_and_is_rewritten_in_the_current_format(
    tmp_path: Path,
) -> None:
    path = _copy("format1", tmp_path)
    old = json.loads(path.read_text())
    ledger = DealLedger.open(tmp_path, 31337, ESCROW, 4)
    assert (ledger.next_index, ledger.last_signed) == (6, 13)
    assert ledger.paid == {0: 7, 1: 6} and ledger.last_tasks == {0, 1}
    assert ledger.settled_elsewhere == {3, 4}
    assert ledger.refunded == {4: (7, 70)}
    assert ledger.legacy_pending == {int(k): v for k, v in old["pending"].items()}
    assert ledger.reserve(1) == 6  # indices of the old release are never reused
    ledger.close()
    written = json.loads(path.read_text())
    assert written["format"] == FORMAT
    assert json.loads(path.with_suffix(".format1.bak").read_text()) == old
    again = DealLedger.open(tmp_path, 31337, ESCROW, 4, lock=False)
    assert (again.paid, again.refunded, again.settled_elsewhere) == (
        {0: 7, 1: 6},
        {4: (7, 70)},
        {3, 4},
    )
    assert again.legacy_pending == ledger.legacy_pending and again.next_index == 7
    book = VoucherBook(deal_id=4, cap=100)
    book.restore(again.paid, again.settled_elsewhere, again.last_signed, again.last_tasks)
    assert not book.has_news()  # the voucher already signed pays everything owed


def test_ledger_of_format_2_opens_keeps_every_entry_and_is_rewritten_in_the_current_format(
    tmp_path: Path,
) -> None:
    path = _copy("format2", tmp_path)
    snapshot = json.loads(path.read_text())
    logged = [
        json.loads(line)["task"] for line in path.with_suffix(".log").read_text().splitlines()
    ]
    ledger = DealLedger.open(tmp_path, 31337, ESCROW, 4)
    ledger.close()
    written = json.loads(path.read_text())
    assert written["format"] == FORMAT
    assert written["tasks"] == snapshot["tasks"] + logged  # the log folded in, nothing lost
    for key in ("next_index", "last_signed", "last_tasks", "batches", "runs", "open_block"):
        assert written[key] == snapshot[key]
    again = DealLedger.open(tmp_path, 31337, ESCROW, 4, lock=False)
    tasks = again.tasks
    assert sorted(tasks) == [0, 1, 2, 3, 4, 5]
    assert again.paid == {0: 7, 1: 6} and (again.last_signed, again.last_tasks) == (13, {0, 1})
    assert again.outputs_of(0) == b"outputs of task 0"
    assert again.outputs_of(1) == b"outputs of task 1"
    assert tasks[1].spot_checked and tasks[1].receipt is not None
    assert tasks[1].receipt.amount == 6 and tasks[1].receipt_signature == b"\x05" * 65
    assert tasks[2].refund == (7, 70) and again.refunded == {2: (7, 70)}
    assert tasks[3].chain == ChainState.CLAIMED and again.batches[1].outcome == "client_won"
    assert set(again.pending) == {4} and tasks[4].ack_signature == b"\x04" * 65
    assert tasks[5].state == TaskState.SENT and tasks[5].request_signature == b"\x03" * 65
    assert again.settled_elsewhere == {2, 3}


def test_ledger_of_a_newer_format_is_refused_with_a_typed_error_and_left_as_it_is(
    tmp_path: Path,
) -> None:
    path = _copy("format2", tmp_path)
    newer = json.loads(path.read_text()) | {"format": FORMAT + 1}
    path.write_text(json.dumps(newer))
    with pytest.raises(LedgerFormatUnknown, match=rf"format {FORMAT + 1} is not one") as caught:
        DealLedger.open(tmp_path, 31337, ESCROW, 4)
    assert isinstance(caught.value, LedgerError) and "\n" not in str(caught.value)
    assert json.loads(path.read_text()) == newer
