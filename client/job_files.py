"""A batch's tasks, read from files and checked before anything is sent.

A program envelope file (``programs.envelope`` wire form, as ``tpumarket job export`` writes
it) and, for inference, one array file per task (safetensors or ``.npz``, tensors named by the
program's flat argument index). Every inputs file is checked against the program's signature
(names, count, shapes, dtypes; the program is deserialized, never run) before any task is
built, so nothing is sent or billed for a file that does not fit.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from client.errors import ClientInputError, ProgramInputsError
from client.models.signature import ProgramSignature
from client.tasks import TaskSpec
from contracts.messages import KIND_COMPILE, KIND_INFERENCE, Plan
from programs.envelope import (
    Array,
    ArrayFormat,
    ProgramEnvelope,
    ProgramFormatError,
    decode_arrays,
    decode_envelope,
    encode_arrays,
)


class JobFileError(ClientInputError):
    """A program or inputs file cannot be read or does not fit the program."""


@dataclass(frozen=True)
class JobTask:
    """One task of a batch: a label for the tables and what to submit."""

    label: str
    spec: TaskSpec


# ---- files ---------------------------------------------------------------------------------


def read_envelope(path: Path) -> ProgramEnvelope:
    """Read a program envelope file and check its hashes and sizes."""
    try:
        return decode_envelope(path.read_bytes())
    except (OSError, ProgramFormatError) as exc:
        raise JobFileError(f"{path}: not a readable program envelope: {exc}") from exc


def read_arrays(path: Path) -> dict[str, Array]:
    """Read a safetensors or ``.npz`` file (told apart by content, never unpickled)."""
    try:
        data = path.read_bytes()
        fmt = ArrayFormat.NPZ if data[:4] == b"PK\x03\x04" else ArrayFormat.SAFETENSORS
        return dict(decode_arrays(data, fmt))
    except (OSError, ProgramFormatError, ValueError) as exc:
        raise JobFileError(f"{path}: not a safetensors or npz file: {exc}") from exc


def program_signature(envelope: ProgramEnvelope) -> ProgramSignature:
    """Return the program's flat arguments and results, read from its serialized form.

    The program is deserialized, never run; the first arguments are its weights section's.
    """
    from jax import export

    try:
        exported = export.deserialize(bytearray(envelope.program))
        weights = decode_arrays(envelope.weights, envelope.array_format) if envelope.weights else {}
    except Exception as exc:  # crafted or damaged bytes: any parser error
        raise JobFileError(f"the program cannot be read: {exc}") from exc
    if set(weights) != {str(i) for i in range(len(weights))}:
        raise JobFileError(
            f"the weights section holds {sorted(weights)}, not 0..{len(weights) - 1}"
        )

    def avals(values: Sequence[Any]) -> list[tuple[tuple[int | str, ...], str]]:
        return [
            (tuple(d if isinstance(d, int) else str(d) for d in a.shape), str(a.dtype))
            for a in values
        ]

    if len(exported.in_avals) < len(weights):
        raise JobFileError(
            f"the weights section holds {len(weights)} tensors; the program takes "
            f"{len(exported.in_avals)} arguments"
        )
    signature = ProgramSignature.from_avals(
        avals(exported.in_avals), avals(exported.out_avals), weights=len(weights)
    )
    for spec in signature.weights:
        array = weights[spec.key]
        if str(array.dtype) != spec.dtype or len(array.shape) != len(spec.shape):
            raise JobFileError(
                f"weight {spec.key} is {array.shape}:{array.dtype}, the program takes "
                f"{spec.describe()}"
            )
    return signature


def inference_tasks(
    envelope: ProgramEnvelope, inputs: Sequence[Path], max_price: int
) -> list[JobTask]:
    """Return one inference task per inputs file (none given: the envelope's own inputs).

    Each file's tensors replace the envelope's inputs section; the weights section is kept
    byte for byte. Every file is checked against the program's signature (names, count,
    shapes, dtypes) before any task is built: nothing is sent, nor billed, for a wrong one.
    """
    signature = program_signature(envelope)
    if not inputs:
        try:
            signature.check_named(dict(decode_arrays(envelope.inputs, envelope.array_format)))
        except ProgramFormatError as exc:
            raise JobFileError(f"the program file's inputs cannot be read: {exc}") from exc
        except ProgramInputsError as exc:
            raise ProgramInputsError(f"the program file's own inputs: {exc}") from exc
        return [
            JobTask("inference (envelope inputs)", TaskSpec(KIND_INFERENCE, envelope, max_price))
        ]
    checked = []
    for path in inputs:
        arrays = read_arrays(path)
        try:
            signature.check_named(arrays)
        except ProgramInputsError as exc:
            raise ProgramInputsError(f"{path}: {exc}") from exc
        checked.append((path, arrays))
    tasks = []
    for path, arrays in checked:
        try:
            encoded = encode_arrays(arrays, envelope.array_format)
            task_envelope = ProgramEnvelope.create(
                program=envelope.program,
                inputs=encoded,
                producer=envelope.producer,
                platforms=envelope.platforms,
                array_format=envelope.array_format,
                weights=envelope.weights,
            )
        except (ProgramFormatError, ValueError) as exc:
            raise ProgramInputsError(f"{path}: {exc}") from exc
        tasks.append(
            JobTask(f"inference {path.name}", TaskSpec(KIND_INFERENCE, task_envelope, max_price))
        )
    return tasks


def compile_tasks(
    envelope: ProgramEnvelope, targets: Sequence[str], max_price: int
) -> list[JobTask]:
    """Return one compile task per target (``local``, ``v5e:1x1`` ...)."""
    return [
        JobTask(f"compile for {t}", TaskSpec(KIND_COMPILE, envelope, max_price, t)) for t in targets
    ]


def default_max_price(plan: Plan, kind: int) -> int | None:
    """Return the most a task of ``kind`` can cost under ``plan``, or None if usage decides.

    Flat and outcome-based prices are known before the task runs (discounts only lower
    them); a metered plan charges by device time, so the caller must name a maximum.
    """
    if plan.price_per_device_ms:
        return None
    return plan.compile_price if kind == KIND_COMPILE else plan.inference_price
