"""A worker's replies to the parent: their typed shapes, and failures classified into them."""

from __future__ import annotations

from typing import Literal, NotRequired, TypedDict

from programs.envelope import ProgramFormatError
from programs.refusals import RejectedProgram
from provider.diagnosis import Category, Diagnosis, Stage, classify, diagnose, hint_set_name
from provider.errors import ProviderError


class TaskError(ProviderError):
    """A classified task failure raised inside the worker."""

    def __init__(self, diagnosis: Diagnosis, *, recycle: bool = False) -> None:
        """Carry ``diagnosis``; ``recycle`` asks the parent to replace this worker."""
        super().__init__(diagnosis.message)
        self.diagnosis = diagnosis
        self.recycle = recycle


class DiagnosisWire(TypedDict):
    """A diagnosis as the worker sends it."""

    category: str
    message: str
    stage: str | None
    op: str | None
    required_bytes: int | None
    available_bytes: int | None
    hints: str | None


class CompiledReply(TypedDict):
    """A program compiled for a target, with its figures."""

    type: Literal["compiled"]
    program_sha256: str
    target: str
    platform: str
    device_kind: str
    compile_time_s: float
    cache_hit: bool
    memory: dict[str, int] | None
    cost: dict[str, float] | None
    available_bytes: int | None


class ValidReply(TypedDict):
    """A program a validator parsed and passed."""

    type: Literal["valid"]
    program_sha256: str


class RanReply(TypedDict):
    """A program run; its outputs follow the header."""

    type: Literal["ran"]
    program_sha256: str
    inputs_sha256: str
    outputs_sha256: str
    device_time_s: float
    cache_hit: bool
    platform: str
    device_kind: str
    compile_time_s: float
    required_bytes: NotRequired[int | None]  # host memory it needs (the parent's admission)
    warm: NotRequired[bool]  # a cold run that left the program warm for the next task


class MissReply(TypedDict):
    """A warm run this worker cannot serve: the parent sends the whole envelope instead."""

    type: Literal["miss"]


class FailedReply(TypedDict):
    """A task that failed, classified."""

    type: Literal["failed"]
    diagnosis: DiagnosisWire
    program_sha256: str | None
    elapsed_s: float
    compile_time_s: float
    recycle: bool


def diagnosis_of(exc: BaseException, stage: Stage) -> Diagnosis:
    """Classify an exception raised at ``stage``."""
    text = f"{type(exc).__name__}: {exc}"
    if isinstance(exc, RejectedProgram):
        return diagnose(exc.category, str(exc), stage=stage, op=exc.op, hints=exc.hints)
    if isinstance(exc, ProgramFormatError):
        return diagnose(Category.MALFORMED_INPUT, str(exc), stage=stage)
    return classify(text, stage)


def failure(
    exc: BaseException,
    stage: Stage,
    program_sha: bytes | None,
    elapsed: float,
    *,
    compile_time: float = 0.0,
) -> FailedReply:
    """The reply for a task that raised ``exc`` at ``stage``."""
    if isinstance(exc, TaskError):
        diagnosis, recycle = exc.diagnosis, exc.recycle
    else:
        diagnosis, recycle = diagnosis_of(exc, stage), False
    return {
        "type": "failed",
        "diagnosis": diagnosis_to_wire(diagnosis),
        "program_sha256": None if program_sha is None else program_sha.hex(),
        "elapsed_s": elapsed,
        "compile_time_s": compile_time,
        "recycle": recycle,
    }


def diagnosis_to_wire(diagnosis: Diagnosis) -> DiagnosisWire:
    """Encode a diagnosis as a JSON-able dict for the parent."""
    return {
        "category": diagnosis.category.value,
        "message": diagnosis.message,
        "stage": None if diagnosis.stage is None else diagnosis.stage.value,
        "op": diagnosis.op,
        "required_bytes": diagnosis.required_bytes,
        "available_bytes": diagnosis.available_bytes,
        "hints": hint_set_name(diagnosis.hints),
    }
