"""The parent's reading of a worker's replies: results, classified failures, bad replies."""

from __future__ import annotations

import time
from typing import Any

from provider.diagnosis import HINT_SETS, Category, Diagnosis, Stage, diagnose
from provider.sandbox.results import (
    CompileResult,
    CostFigures,
    InferenceResult,
    MemoryFigures,
    TaskFailure,
)
from provider.sandbox.wire import Header


def reply_of(
    reply: tuple[Header, bytes] | Diagnosis, started: float
) -> tuple[Header, bytes] | TaskFailure:
    if isinstance(reply, Diagnosis):
        return TaskFailure(
            diagnosis=reply, program_sha256=None, elapsed_s=time.perf_counter() - started
        )
    header, body = reply
    if header.get("type") == "failed":
        return failure_from_wire(header)
    return header, body


def ran_of(reply: tuple[Header, bytes] | TaskFailure) -> InferenceResult | TaskFailure:
    if isinstance(reply, TaskFailure):
        return reply
    header, body = reply
    try:
        return InferenceResult(
            program_sha256=bytes.fromhex(header["program_sha256"]),
            inputs_sha256=bytes.fromhex(header["inputs_sha256"]),
            outputs=body,
            outputs_sha256=bytes.fromhex(header["outputs_sha256"]),
            device_time_s=float(header["device_time_s"]),
            compile_time_s=float(header["compile_time_s"]),
            cache_hit=bool(header["cache_hit"]),
            platform=str(header["platform"]),
            device_kind=str(header["device_kind"]),
        )
    except (KeyError, TypeError, ValueError) as exc:
        return bad_reply(exc)


def opt_int(value: Any) -> int | None:
    return None if value is None else int(value)


def failure_from_wire(header: Header) -> TaskFailure:
    try:
        wire = header["diagnosis"]
        category = Category(wire["category"])
        stage = None if wire["stage"] is None else Stage(wire["stage"])
        diagnosis = diagnose(
            category,
            str(wire["message"]),
            stage=stage,
            op=None if wire["op"] is None else str(wire["op"]),
            required_bytes=opt_int(wire["required_bytes"]),
            available_bytes=opt_int(wire["available_bytes"]),
            hints=HINT_SETS.get(str(wire.get("hints"))),
        )
        sha = header["program_sha256"]
        return TaskFailure(
            diagnosis=diagnosis,
            program_sha256=None if sha is None else bytes.fromhex(sha),
            elapsed_s=float(header["elapsed_s"]),
            compile_time_s=float(header.get("compile_time_s", 0.0)),
        )
    except (KeyError, TypeError, ValueError) as exc:
        return bad_reply(exc)


def bad_reply(exc: Exception) -> TaskFailure:
    return TaskFailure(
        diagnosis=diagnose(Category.WORKER_CRASH, f"worker sent a malformed reply: {exc}"),
        program_sha256=None,
        elapsed_s=0.0,
    )


def compiled_of(reply: tuple[Header, bytes] | TaskFailure) -> CompileResult | TaskFailure:
    """The compile result a worker answered, or the failure."""
    if isinstance(reply, TaskFailure):
        return reply
    header, _ = reply
    try:
        memory = header["memory"]
        cost = header["cost"]
        return CompileResult(
            program_sha256=bytes.fromhex(header["program_sha256"]),
            target=str(header["target"]),
            platform=str(header["platform"]),
            device_kind=str(header["device_kind"]),
            compile_time_s=float(header["compile_time_s"]),
            cache_hit=bool(header["cache_hit"]),
            memory=None if memory is None else MemoryFigures(**memory),
            cost=None if cost is None else CostFigures(**cost),
            available_bytes=opt_int(header["available_bytes"]),
        )
    except (KeyError, TypeError, ValueError) as exc:
        return bad_reply(exc)
