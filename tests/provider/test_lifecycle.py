"""Settlement actions are a StrEnum whose values are the strings the journal stores."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from contracts.messages import Domain, address_of
from provider.journal import Journal
from provider.lifecycle import SettlementAction, TaskState

KEY = "0x" + "11" * 32
PROVIDER = address_of(KEY)
DOMAIN = Domain(chain_id=31337, verifying_contract="0x" + "22" * 20)


def test_actions_are_the_stored_strings() -> None:
    assert [a.value for a in SettlementAction] == [
        "opened",
        "redeem",
        "claim",
        "finalize",
        "rejected",
        "refunded",
        "missed",
        "voucher_unusable",
        "closed",
    ]
    assert [s.value for s in TaskState] == ["acked", "succeeded", "failed"]
    assert SettlementAction.CLAIM == "claim" and f"{SettlementAction.CLAIM}" == "claim"


def test_journal_when_action_recorded_then_stored_as_its_string_and_read_back_as_member(
    tmp_path: Path,
) -> None:
    path = tmp_path / "journal.db"
    journal = Journal(path, PROVIDER, DOMAIN)
    journal.record_settlement(3, SettlementAction.REFUNDED, {"tasks": [0]}, None)
    journal.record_settlement(3, "claim", {"batch_id": 0, "tasks": [1], "amount": "5"}, "0x01")
    journal.close()
    db = sqlite3.connect(path)
    try:
        stored = db.execute(
            "SELECT action, typeof(action) FROM settlements ORDER BY seq"
        ).fetchall()
    finally:
        db.close()
    assert stored == [("refunded", "text"), ("claim", "text")]
    reopened = Journal(path, PROVIDER, DOMAIN)
    try:
        book = dict(reopened.iter_books())[3]
        assert [s.action for s in book.settlements] == [
            SettlementAction.REFUNDED,
            SettlementAction.CLAIM,
        ]
        assert all(type(s.action) is SettlementAction for s in book.settlements)
        assert book.refunded_tasks() == {0} and book.claimed_tasks() == {1}
    finally:
        reopened.close()


def test_journal_when_action_unknown_then_refused_before_writing(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "journal.db", PROVIDER, DOMAIN)
    try:
        with pytest.raises(ValueError, match="payout"):
            journal.record_settlement(3, "payout", {}, None)
        assert list(journal.settlement_history()) == []
    finally:
        journal.close()
