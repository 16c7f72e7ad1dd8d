"""How the demo words what happened: amounts, sizes, and one line per task outcome."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, Final

from client.demo.terms import UNIT
from client.demo.workload import Task
from client.tasks import TaskOutcome

GIB: Final = 1 << 30

Say = Callable[[str], None]


def tokens(amount: int) -> str:
    """Return ``amount`` base units as tokens, four decimals."""
    return f"{amount / UNIT:.4f}"


def size(count: int) -> str:
    """Return a byte count in GiB or MiB."""
    if count >= GIB:
        return f"{count / GIB:.2f} GiB"
    return f"{count / (1 << 20):.1f} MiB"


def outcome_line(outcome: TaskOutcome, task: Task | None) -> str:
    """Return what became of a task, as its progress line says it."""
    view = outcome.view
    if view is None or view.receipt is None:
        return "not delivered"
    if outcome.rejected:
        return f"not paid: {late_or_reason(outcome)}"
    failure = delivered_json(outcome) if view.diagnosis else None
    if failure is not None:
        return f"failed, diagnosed {failure.get('category')}: {diagnosis_line(failure)}"
    return f"verified, {tokens(view.receipt.amount)}: {success_detail(outcome, task)}"


def delivered_json(outcome: TaskOutcome) -> dict[str, Any] | None:
    """Return a compile report or a diagnosis from the delivered (hash-verified) bytes."""
    view = outcome.view
    if view is None or not view.outputs or not (view.diagnosis or view.report):
        return None
    try:
        data = json.loads(view.outputs)
    except ValueError:
        return None
    return data if isinstance(data, dict) else None


def success_detail(outcome: TaskOutcome, task: Task | None) -> str:
    """Return what a verified success found: a compile's HBM figures or what the outputs say."""
    report = delivered_json(outcome)
    if report is not None and report.get("memory_total_bytes") is not None:
        return (
            f"fits: {size(int(report['memory_total_bytes']))} of "
            f"{size(int(report.get('available_bytes') or 0))} HBM "
            f"({report.get('device_kind')}, compiled in {float(report['compile_time_s']):.1f} s)"
        )
    said = ""
    if task is not None and task.describe is not None and outcome.view and outcome.view.outputs:
        said = task.describe(outcome.view.outputs) + "; "
    return said + ("outputs spot-checked on CPU" if outcome.spot_checked else "receipt verified")


def late_or_reason(outcome: TaskOutcome) -> str:
    """Return how late a delivery was, or why it was not paid."""
    view = outcome.view
    if outcome.ack is not None and view is not None and view.receipt is not None:
        late = view.receipt.finished_at - outcome.request.deadline
        if late > 0:
            return f"delivered {late} s after its deadline"
    return outcome.rejected or "no delivery"


def diagnosis_line(diagnosis: dict[str, Any]) -> str:
    """Return a diagnosed failure's figures (or first error line) and its first hint."""
    parts = [str(diagnosis.get("message") or "")[:80]]
    required, available = diagnosis.get("required_bytes"), diagnosis.get("available_bytes")
    if required is not None and available is not None:
        parts = [f"needs {size(int(required))}, {size(int(available))} available"]
    hints = diagnosis.get("hints") or []
    if hints:
        parts.append(f"hint: {hints[0]}")
    return "; ".join(p for p in parts if p)
