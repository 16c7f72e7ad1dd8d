"""Asking the provider once more for a task's result: its ack if the ledger lacks it, its
delivery verified and recorded, a verified one added to the voucher book."""

from __future__ import annotations

import math
from typing import Any

from client.errors import ClientError, DeliveryRejected, ProviderRejected
from client.job_records import view_fields
from client.ledger import DealLedger
from client.ledger_records import TaskRecord, TaskState
from client.session import DealSession


def refresh_task(session: DealSession, ledger: DealLedger, index: int) -> TaskRecord | None:
    """Ask the provider once more for a task's result; verify and record it.

    A task never acked as far as the ledger knows gets its ack if the provider has one;
    a task the provider never got (404) is recorded as refused once its request can no
    longer be accepted. Return the task's record as it now stands.
    """
    record = ledger.tasks.get(index)
    if record is None or ledger.read_only:
        return record
    try:
        view = session.provider.fetch(session.deal_id, index, wait_s=0)
    except ProviderRejected as exc:
        slo_ms, _ = session.terms()
        too_late = record.request.deadline < session.now() + math.ceil(slo_ms / 1000)
        if exc.status == 404 and record.state == TaskState.SENT and too_late:
            return ledger.update(
                index, state=TaskState.REFUSED, reason="never reached the provider"
            )
        return record
    except ClientError:
        return record
    changes: dict[str, Any] = {}
    if record.ack is None:
        try:
            session.check_ack(record.request, view.ack, view.ack_signature)
        except DeliveryRejected as exc:
            return ledger.update(index, state=TaskState.REFUSED, reason=exc.reason)
        changes.update(state=TaskState.ACKED, ack=view.ack, ack_signature=view.ack_signature)
        record = ledger.update(index, **changes)
    if view.receipt is None or record.ack is None or record.state == TaskState.VERIFIED:
        return record
    try:
        receipt = session.verify_view(record.request, record.ack, view)
    except DeliveryRejected as exc:
        return ledger.update(
            index,
            state=TaskState.REJECTED,
            reason=exc.reason,
            **view_fields(ledger, index, view),
        )
    record = ledger.update(
        index, state=TaskState.VERIFIED, reason=None, **view_fields(ledger, index, view)
    )
    if record.payable and index not in session.book.paid:
        session.payments.add_payable(receipt)
    outcome = session.outcomes.get(index)
    if outcome is not None and not outcome.verified:
        outcome.view, outcome.verified, outcome.rejected = view, True, None
    return record
