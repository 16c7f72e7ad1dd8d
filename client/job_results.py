"""What became of each task of a batch, in words for the report, and its delivery on disk."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from client.job_files import JobTask
from client.provider_http import TaskView
from client.tasks import TaskOutcome
from programs.envelope import ArrayFormat, ProgramFormatError, decode_arrays


@dataclass
class TaskResult:
    """What became of one task of the batch."""

    task: JobTask
    outcome: TaskOutcome | None = None
    error: str | None = None  # submission failed: nothing acked, nothing owed
    skipped: bool = False  # not sent: it could pass the cap
    interrupted: bool = False  # not sent: the run was interrupted first
    resumed: bool = False  # a crashed run's task with the same inputs, taken over

    @property
    def index(self) -> int | None:
        """Return the task's index in the deal, if it was submitted."""
        return self.outcome.index if self.outcome else None

    @property
    def state(self) -> str:
        """Return paid, failed: <category>, refunded, claimed, rejected, undelivered, pending,
        unknown, error, not sent or skipped."""
        o = self.outcome
        if self.skipped:
            return "skipped"
        if self.interrupted:
            return "not sent"
        if o is None:
            return "error"
        if o.refunded is not None:
            return "refunded"
        if o.verified:
            diagnosis = o.view.diagnosis if o.view else None
            return f"failed: {diagnosis.get('category')}" if diagnosis else "paid"
        if o.claimed:
            return "claimed"
        if o.ack is None:
            return "unknown"
        if o.view is not None and o.view.receipt is not None:
            return "rejected"
        if o.abandoned:
            return "pending"
        return "undelivered"

    @property
    def amount(self) -> int:
        """Return what the task costs this client (0 unless verified)."""
        o = self.outcome
        return o.view.receipt.amount if o and o.verified and o.view and o.view.receipt else 0

    def detail(self) -> str:
        """Return one line on the result: outputs, compile figures, diagnosis or reason."""
        o = self.outcome
        if self.skipped:
            return "not sent: it could take the deal past its cap"
        if self.interrupted:
            return "not sent: the run was interrupted"
        if o is None:
            return self.error or ""
        resumed = " (resumed)" if self.resumed else ""
        if o.refunded is not None:
            why = o.rejected or f"no delivery by the deadline {o.request.deadline}"
            return f"refund {o.refunded[0]} + penalty {o.refunded[1]}; {why}"
        if o.ack is None:
            return (o.rejected or "the provider's answer was lost") + "; see `job status`"
        if o.rejected:
            return o.rejected + resumed
        view = o.view
        if view is None or view.receipt is None:
            if o.abandoned:
                return f"awaited until the run stopped; deadline {o.request.deadline}"
            return f"no delivery by the deadline {o.request.deadline}"
        if view.diagnosis:
            return str(view.diagnosis.get("message") or "")[:100] + resumed
        if view.report:
            return compile_line(view.report) + resumed
        try:
            arrays = decode_arrays(view.outputs or b"", ArrayFormat.SAFETENSORS)
        except ProgramFormatError:
            return "outputs verified" + resumed
        shapes = ", ".join(f"{k}:{tuple(a.shape)}" for k, a in sorted(arrays.items()))
        checked = ", spot-checked" if o.spot_checked else ""
        return f"outputs {shapes}{checked}{resumed}"


def byte_size(count: int) -> str:
    """Return ``count`` bytes in binary units: ``512 B``, ``1.50 MiB``, ``15.75 GiB``."""
    if count < 1024:
        return f"{count} B"
    value, units = count / 1024, ["KiB", "MiB", "GiB", "TiB"]
    while value >= 1024 and len(units) > 1:
        value, units = value / 1024, units[1:]
    return f"{value:.2f} {units[0]}"


def compile_line(report: Mapping[str, Any]) -> str:
    """Return a compile report in one line: the device, the memory it needs and, where the
    provider measured it, the target's memory: ``memory 1.20 MiB of 15.75 GiB (0.0%)``."""
    line = f"compiled for {report.get('device_kind')}"
    needed, total = report.get("memory_total_bytes"), report.get("available_bytes")
    if not isinstance(needed, int):
        return line + ", memory not reported"
    line += f", memory {byte_size(needed)}"
    if isinstance(total, int) and total > 0:
        line += f" of {byte_size(total)} ({100 * needed / total:.1f}%)"
    return line


def save_outputs(results: Sequence[TaskResult], out_dir: Path) -> list[Path]:
    """Write each verified task's delivery: ``task-<i>.safetensors`` or ``task-<i>.json``."""
    written = []
    for r in results:
        o = r.outcome
        if o is None or not o.verified or o.view is None or not o.view.outputs:
            continue
        written.append(write_output(out_dir, o.index, o.view))
    return written


def write_output(out_dir: Path, index: int, view: TaskView) -> Path:
    """Write one delivery into ``out_dir``; return the file's path."""
    out_dir.mkdir(parents=True, exist_ok=True)
    is_json = bool(view.report or view.diagnosis)
    path = out_dir / f"task-{index}.{'json' if is_json else 'safetensors'}"
    if is_json:
        path.write_text(json.dumps(json.loads(view.outputs or b"{}"), indent=1, sort_keys=True))
    else:
        path.write_bytes(view.outputs or b"")
    return path
