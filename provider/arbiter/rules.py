"""The arbiter's rules: how a disputed batch is decided from its evidence (pure, no I/O).

A dispute covers one claimed batch. For each task of it the arbiter holds what the chain shows
(the provider's receipt, whose program and input hashes the client signed in its request) and
what each party sent in time: the client the program envelope, the provider the outputs. The
provider wins the batch only if it wins every task; a task is the client's when

- the provider sent no outputs, or outputs that do not hash to its receipt (``outputs_missing``,
  ``outputs_not_receipted``);
- the outputs differ from the arbiter's re-execution beyond the deal's tolerance, or the
  re-execution's verdict differs from the receipt's (``outputs_differ``, ``verdict_differs``);

and the provider's when the client sent no program, or one that does not hash to what it signed
(``program_missing``, ``program_not_signed``: a party that does not answer in time loses), or
when the re-execution agrees (``upheld``).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from contracts.evidence import DEFAULT_ATOL, DEFAULT_RTOL, MEMORY_RTOL, Tolerance
from programs.envelope import ArrayFormat, ProgramFormatError, decode_arrays

__all__ = [
    "DEFAULT_ATOL",
    "DEFAULT_RTOL",
    "MEMORY_RTOL",
    "Rerun",
    "TaskFacts",
    "TaskRuling",
    "Tolerance",
    "Verdict",
    "judge_rerun",
    "judge_without_rerun",
    "provider_wins",
]


class Verdict(StrEnum):
    """Why a task was decided as it was; the first word says for whom."""

    UPHELD = "upheld"
    PROGRAM_MISSING = "program_missing"
    PROGRAM_NOT_SIGNED = "program_not_signed"
    OUTPUTS_MISSING = "outputs_missing"
    OUTPUTS_NOT_RECEIPTED = "outputs_not_receipted"
    OUTPUTS_DIFFER = "outputs_differ"
    VERDICT_DIFFERS = "verdict_differs"

    @property
    def provider_wins(self) -> bool:
        """Whether this verdict decides the task for the provider."""
        return self in (Verdict.UPHELD, Verdict.PROGRAM_MISSING, Verdict.PROGRAM_NOT_SIGNED)


@dataclass(frozen=True, slots=True)
class Rerun:
    """What the arbiter's own execution gave: outputs bytes on success, else a status code."""

    status: int
    outputs: bytes
    kind: int


@dataclass(frozen=True, slots=True)
class TaskFacts:
    """One claimed task: the receipt's commitments and the evidence the parties sent."""

    task_index: int
    status: int
    output_hash: bytes
    outputs: bytes | None
    outputs_sha256: bytes | None
    program_ok: bool | None
    """None: no program came; False: one came that does not hash to the signed request."""


@dataclass(frozen=True, slots=True)
class TaskRuling:
    """The decision on one task and its reason."""

    task_index: int
    verdict: Verdict
    detail: str

    def as_json(self) -> dict[str, Any]:
        """Return the ruling as the ruling document lists it."""
        return {"task": self.task_index, "verdict": str(self.verdict), "detail": self.detail}


def needs_rerun(facts: TaskFacts) -> bool:
    """Whether the task can only be decided by running it (both parties' evidence is good)."""
    return judge_without_rerun(facts) is None


def judge_without_rerun(facts: TaskFacts) -> TaskRuling | None:
    """Decide a task from the evidence alone, or return None when a re-execution must decide."""
    index = facts.task_index
    if facts.outputs is None:
        return TaskRuling(index, Verdict.OUTPUTS_MISSING, "the provider sent no outputs in time")
    if facts.outputs_sha256 != facts.output_hash:
        return TaskRuling(
            index, Verdict.OUTPUTS_NOT_RECEIPTED, "the outputs do not hash to the receipt's"
        )
    if facts.program_ok is None:
        return TaskRuling(index, Verdict.PROGRAM_MISSING, "the client sent no program in time")
    if not facts.program_ok:
        return TaskRuling(
            index, Verdict.PROGRAM_NOT_SIGNED, "the client's program is not the one it signed"
        )
    return None


def judge_rerun(
    facts: TaskFacts, rerun: Rerun, tolerance: Tolerance, *, compile_task: bool
) -> TaskRuling:
    """Decide a task whose evidence is complete by the arbiter's own execution of it."""
    index = facts.task_index
    assert facts.outputs is not None
    if rerun.status != facts.status:
        return TaskRuling(
            index,
            Verdict.VERDICT_DIFFERS,
            f"the receipt says status {facts.status}, the re-execution gave {rerun.status}",
        )
    if facts.status != 0:  # both failed alike: the failure category is the result
        return TaskRuling(index, Verdict.UPHELD, f"both failed with status {facts.status}")
    why = (
        _compare_reports(rerun.outputs, facts.outputs)
        if compile_task
        else _compare_arrays(rerun.outputs, facts.outputs, tolerance)
    )
    if why is not None:
        return TaskRuling(index, Verdict.OUTPUTS_DIFFER, why)
    return TaskRuling(index, Verdict.UPHELD, "the re-execution agrees within the tolerance")


def provider_wins(rulings: Sequence[TaskRuling]) -> bool:
    """Whether the batch goes to the provider: it must win every task of it."""
    return bool(rulings) and all(r.verdict.provider_wins for r in rulings)


def _compare_arrays(got: bytes, want: bytes, tolerance: Tolerance) -> str | None:
    try:
        mine = decode_arrays(got, ArrayFormat.SAFETENSORS)
    except ProgramFormatError as exc:  # our own worker's bytes: not the provider's fault
        raise ValueError(f"the re-execution's outputs do not decode: {exc}") from exc
    try:
        theirs = decode_arrays(want, ArrayFormat.SAFETENSORS)
    except ProgramFormatError as exc:
        return f"the delivered outputs are not safetensors: {exc}"
    return tolerance.compare(mine, theirs)


def _compare_reports(got: bytes, want: bytes) -> str | None:
    try:
        mine, theirs = json.loads(got), json.loads(want)
    except ValueError:
        return "the delivered compile report is not JSON"
    if not isinstance(theirs, dict):
        return "the delivered compile report is not an object"
    for key in ("target", "platform", "device_kind"):
        if mine.get(key) != theirs.get(key):
            return f"compile report {key}: {theirs.get(key)!r} delivered, {mine.get(key)!r} here"
    a, b = mine.get("memory_total_bytes"), theirs.get("memory_total_bytes")
    if (a is None) != (b is None):
        return "compile report: memory figures present on one side only"
    if (
        a is not None
        and b is not None
        and (not isinstance(b, int) or abs(a - b) > MEMORY_RTOL * max(abs(a), 1))
    ):
        return f"compile report: {b} bytes of memory delivered, {a} measured here"
    return None
