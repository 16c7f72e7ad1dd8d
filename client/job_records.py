"""A job's tasks in the deal's ledger: the record of a task's outcome, the outcome a resumed
task is rebuilt from, and which earlier tasks a rerun takes over."""

from __future__ import annotations

from typing import Any

from client.ledger import DealLedger
from client.ledger_records import ChainState, TaskRecord, TaskState
from client.provider_http import TaskView
from client.tasks import TaskOutcome, TaskSpec
from contracts.messages import TaskRequest

WorkKey = tuple[int, bytes, bytes, int]


def work_key(request: TaskRequest) -> WorkKey:
    """Return what identifies a task's work: same key, same inputs (a rerun's match)."""
    return (request.kind, request.program_hash, request.input_hash, request.max_price)


def spec_key(spec: TaskSpec) -> WorkKey:
    """Return the work key a request for ``spec`` would have."""
    return (spec.kind, spec.envelope.program_sha256, spec.input_hash(), spec.max_price)


def view_of(ledger: DealLedger, record: TaskRecord) -> TaskView | None:
    """Return the provider's answer as the ledger kept it (None before the ack)."""
    if record.ack is None:
        return None
    return TaskView(
        state=record.result_state or "acked",
        ack=record.ack,
        ack_signature=record.ack_signature,
        receipt=record.receipt,
        receipt_signature=record.receipt_signature,
        outputs=ledger.outputs_of(record.index),
        report=record.report,
        diagnosis=record.diagnosis,
    )


def view_fields(ledger: DealLedger, index: int, view: TaskView) -> dict[str, Any]:
    """Save a delivery's outputs (durably, first) and return the fields to record."""
    outputs = ledger.save_outputs(index, view.outputs) if view.outputs else None
    return {
        "receipt": view.receipt,
        "receipt_signature": view.receipt_signature,
        "outputs": outputs,
        "result_state": view.state,
        "report": view.report,
        "diagnosis": view.diagnosis,
    }


def record_outcome(ledger: DealLedger, outcome: TaskOutcome, run: int, label: str) -> None:
    """Write a task's new state to the ledger (a new request starts a new record)."""
    index = outcome.index
    known = ledger.tasks.get(index)
    if known is None or known.request != outcome.request:
        known = ledger.put(
            TaskRecord(
                index=index,
                run=run,
                label=label or (known.label if known else ""),
                request=outcome.request,
                request_signature=outcome.request_signature,
                target=outcome.spec.target,
            )
        )
    changes: dict[str, Any] = {}
    if outcome.ack is not None and known.ack is None:
        changes.update(state=TaskState.ACKED, ack=outcome.ack, ack_signature=outcome.ack_signature)
    view = outcome.view
    if outcome.verified and view is not None and known.state != TaskState.VERIFIED:
        changes.update(state=TaskState.VERIFIED, reason=None)
        changes.update(view_fields(ledger, index, view), spot_checked=outcome.spot_checked)
    elif (
        outcome.rejected
        and view is not None
        and view.receipt is not None
        and known.state != TaskState.VERIFIED
    ):
        changes.update(state=TaskState.REJECTED, reason=outcome.rejected)
        changes.update(view_fields(ledger, index, view))
    elif outcome.rejected and known.reason != outcome.rejected:
        changes.update(reason=outcome.rejected)
    if changes:
        ledger.update(index, **changes)


def outcome_from(ledger: DealLedger, record: TaskRecord, spec: TaskSpec) -> TaskOutcome:
    """Rebuild a task's outcome from its ledger record (a resumed task)."""
    return TaskOutcome(
        index=record.index,
        spec=spec,
        request=record.request,
        request_signature=record.request_signature,
        ack=record.ack,
        ack_signature=record.ack_signature,
        view=view_of(ledger, record),
        verified=record.state == TaskState.VERIFIED,
        rejected=record.reason,
        refunded=record.refund,
        spot_checked=record.spot_checked,
        claimed=record.chain == ChainState.CLAIMED,
    )


def resumable_records(ledger: DealLedger, run: int) -> dict[WorkKey, list[TaskRecord]]:
    """Return the earlier tasks run ``run`` takes over instead of sending their inputs again,
    by work key (kind, program, inputs, max price).

    A rerun is idempotent by inputs, whatever was looked at in between (``job status``,
    ``--fetch`` and ``job refund`` record the chain's state; they never make a rerun forget):
    an input sent once is not sent as a new task while its earlier task was or can still be
    delivered, paid or refunded. Every earlier task is taken over (acked ones collected,
    verified ones reused, one the provider claimed counts as paid for its input: its result
    is fetched, never sent or vouched again), except one the provider refused or one refunded
    on chain: neither was paid, nor can be.
    """
    found: dict[WorkKey, list[TaskRecord]] = {}
    for _, record in sorted(ledger.tasks.items()):
        if record.run == run or not open_for_rerun(record):
            continue
        found.setdefault(work_key(record.request), []).append(record)
    return found


def open_for_rerun(record: TaskRecord) -> bool:
    """Return whether a run with ``record``'s inputs takes it over (``resumable_records``)."""
    return record.state != TaskState.REFUSED and record.chain != ChainState.REFUNDED


NOT_ACKED = ("not accepted: ", "never sent", "never reached the provider")
"""Reasons of refused tasks the provider never acked: their index is free again."""


def free_indices(ledger: DealLedger) -> list[int]:
    """Return the indices below the ledger's next one that no provider acked, lowest first.

    The provider acks a deal's indices in order with no gap, so an index left unused (reserved
    by a run that crashed or stopped before signing there, or refused before any ack) must be
    taken by the next task: nothing was ever signed there, or what was is refused. Indices of
    a migrated format-1 ledger are never reused.
    """
    legacy = (
        set(ledger.legacy_paid)
        | ledger.legacy_settled
        | set(ledger.legacy_refunded)
        | set(ledger.legacy_pending)
    )
    floor = max(legacy, default=-1) + 1
    out = []
    for index in range(floor, ledger.next_index):
        record = ledger.tasks.get(index)
        if record is None or (
            record.state == TaskState.REFUSED
            and record.ack is None
            and (record.reason or "").startswith(NOT_ACKED)
        ):
            out.append(index)
    return out
