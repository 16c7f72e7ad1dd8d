"""Failure diagnosis: turn an error message and the stage it came from into a category.

Pure rules, no JAX import: the sandbox feeds it the text of whatever a worker raised, or
builds a diagnosis directly for what the parent observed (a timeout, a dead worker). Receipts
carry :attr:`Diagnosis.code` on chain, so the codes are stable: never renumber them. The
categories, their hints and the named hint sets are :mod:`programs.refusals` and
:mod:`programs.hints` (the client's export refuses a program in the same words).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Final

from programs.hints import (
    COMPILER_CRASH_HINTS,
    COMPILER_ERROR_HINTS,
    CPU_LIMIT_HINTS,
    F64_ON_TPU_HINTS,
    HINT_SETS,
    KILLED_HINTS,
    MISSING_OP_HINTS,
    NESTING_HINTS,
    OP_COUNT_HINTS,
    OUTPUT_DTYPE_HINTS,
    SORT_COMPARATOR_HINTS,
    VERIFIER_HINTS,
)
from programs.refusals import HINTS, Category

SUCCESS_CODE: Final = 0
MAX_MESSAGE_CHARS: Final = 500


class Stage(StrEnum):
    """Where in a task's life a failure happened."""

    PARSE = "parse"
    VALIDATE = "validate"
    COMPILE = "compile"
    EXECUTE = "execute"


def hint_set_name(hints: tuple[str, ...]) -> str | None:
    """Return the name of ``hints`` in :data:`HINT_SETS`, or None for a category's own."""
    return next((name for name, known in HINT_SETS.items() if known == hints), None)


@dataclass(frozen=True, slots=True)
class Diagnosis:
    """A classified failure, as carried in results and (by code) in receipts."""

    category: Category
    message: str
    stage: Stage | None = None
    op: str | None = None
    required_bytes: int | None = None
    available_bytes: int | None = None
    hints: tuple[str, ...] = ()

    @property
    def code(self) -> int:
        """Return the on-chain code of the category."""
        return self.category.code


def diagnose(
    category: Category,
    message: str,
    *,
    stage: Stage | None = None,
    op: str | None = None,
    required_bytes: int | None = None,
    available_bytes: int | None = None,
    hints: tuple[str, ...] | None = None,
) -> Diagnosis:
    """Build a diagnosis of a known category, with ``hints`` or its standard ones."""
    return Diagnosis(
        category=category,
        message=first_meaningful_line(message),
        stage=stage,
        op=op,
        required_bytes=required_bytes,
        available_bytes=available_bytes,
        hints=HINTS[category] if hints is None else hints,
    )


_NOISE = re.compile(
    r"^(Traceback \(most recent call last\)|File \"|\s*\^+\s*$|During handling|"
    r"The above exception|-+$|=+ Source Location|\S+\.cc:\d+$|For simplicity, JAX)"
)
_EXC_PREFIX = re.compile(r"^(?:[\w.]+\.)?(?:\w*Error|\w*Exception)(?:\(\w+\))?:\s*")


def first_meaningful_line(text: str) -> str:
    """Return the first line that says what went wrong, without traceback noise."""
    lines = [line.strip() for line in text.strip().splitlines()]
    if "Traceback (most recent call last)" in text:
        # The source lines inside a traceback are noise; the exception line says it.
        raised = [line for line in lines if _EXC_PREFIX.match(line)]
        if raised:
            return (_EXC_PREFIX.sub("", raised[0]) or raised[0])[:MAX_MESSAGE_CHARS]
    for line in lines:
        if not line or _NOISE.match(line):
            continue
        cleaned = _EXC_PREFIX.sub("", line) or line
        return cleaned[:MAX_MESSAGE_CHARS]
    return (lines[-1] if lines else "")[:MAX_MESSAGE_CHARS] or "unknown error"


_UNITS: Final = {"": 1, "B": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
_SIZE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([KMGT]?)(?:i?B)?\s*$")


def parse_size(text: str) -> int | None:
    """Parse an XLA size such as ``36.00G``, ``512.5M`` or ``1234`` into bytes."""
    match = _SIZE.match(text)
    if match is None:
        return None
    return int(float(match.group(1)) * _UNITS[match.group(2)])


_HBM = re.compile(
    r"required[^()]*\((?P<req>[0-9.]+\s*[KMGT]?i?B?)\)\s*exceeds available\s*\w*\s*"
    r"\((?P<avail>[0-9.]+\s*[KMGT]?i?B?)\)"
)
_ALLOC = re.compile(r"(?:allocating|allocate)\s+(?P<req>[0-9]+)\s*bytes", re.IGNORECASE)
_CUSTOM_TARGET = re.compile(
    r"(?:custom call to|Custom emitter for|custom[_ ]call target[^\w]*)\s*@?\"?(?P<op>[\w.$]+)"
)
_NAMED_OP = re.compile(r"(?:operand type for|op|operation)\s+'?\"?(?P<op>[\w.$]+)", re.IGNORECASE)


def _oom(text: str, stage: Stage) -> Diagnosis:
    required = available = None
    match = _HBM.search(text)
    if match is not None:
        required, available = parse_size(match["req"]), parse_size(match["avail"])
    else:
        alloc = _ALLOC.search(text)
        if alloc is not None:
            required = int(alloc["req"])
    return diagnose(
        Category.OOM, text, stage=stage, required_bytes=required, available_bytes=available
    )


_FOREIGN_CODE = re.compile(r"custom[_ ]call|callback|kernel|Custom emitter", re.IGNORECASE)


def _unsupported(text: str, stage: Stage) -> Diagnosis:
    """An op the runtime lacks; the custom-call hints only where a custom call is the cause."""
    custom = _CUSTOM_TARGET.search(text)
    match = custom or _NAMED_OP.search(text)
    foreign = custom is not None or _FOREIGN_CODE.search(text) is not None
    return diagnose(
        Category.UNSUPPORTED_OP,
        text,
        stage=stage,
        op=None if match is None else match["op"],
        hints=None if foreign else MISSING_OP_HINTS,
    )


_VERIFIED_OP = re.compile(r"'(?P<op>[\w.$]+)' op\b")


def _verifier(text: str, stage: Stage) -> Diagnosis:
    """A module the MLIR verifier refused while lowering: its first reason and op, or, when
    the verifier gave none, what was checked."""
    reasons = [
        line.strip()
        for line in text.split("verifier errors", 1)[1].splitlines()[1:]
        if line.startswith("\t") and not line.startswith("\t\t") and line.strip()
    ]
    match = _VERIFIED_OP.search(reasons[0]) if reasons else None
    if reasons:
        message = f"the module failed MLIR verification when lowered: {reasons[0]}"
    else:
        message = (
            "the module failed MLIR verification when lowered for this provider's JAX (its ops "
            "checked against the argument types it states); the verifier named no op and gave "
            "no reason"
        )
    return diagnose(
        Category.UNSUPPORTED_OP,
        message,
        stage=stage,
        op=None if match is None else match["op"],
        hints=VERIFIER_HINTS,
    )


def _simple(category: Category) -> Callable[[str, Stage], Diagnosis]:
    def build(text: str, stage: Stage) -> Diagnosis:
        return diagnose(category, text, stage=stage)

    return build


# Ordered: the first rule whose pattern matches anywhere in the text wins.
_RULES: Final[tuple[tuple[re.Pattern[str], Callable[[str, Stage], Diagnosis]], ...]] = (
    # The verifier's header first: the module dump that may follow it can say anything.
    (re.compile(r"Cannot lower jaxpr with verifier errors"), _verifier),
    # Version skew first: an old JAX reading a new blob reports "exported for 0 devices".
    (
        re.compile(
            r"calling.convention version|serialization version|StableHLO version|"
            r"exported for 0 devices|version .* (?:outside|not in) .*range|"
            r"newer than the provider",
            re.IGNORECASE,
        ),
        _simple(Category.VERSION_MISMATCH),
    ),
    (
        re.compile(
            r"RESOURCE_EXHAUSTED|[Oo]ut of memory|Ran out of memory|MemoryError|"
            r"std::bad_alloc|exceeds (?:the )?(?:available|device) memory"
        ),
        _oom,
    ),
    (
        re.compile(
            r"was exported for platforms?|exported for platform|"
            r"not exported for|no platform"
        ),
        _simple(Category.PLATFORM_MISMATCH),
    ),
    (
        re.compile(
            r"Length of device assignment \d+ is not equal to the size of the mesh|"
            r"exported for \d+ devices|device count",
            re.IGNORECASE,
        ),
        _simple(Category.DEVICE_COUNT_MISMATCH),
    ),
    (
        re.compile(
            r"No registered implementation for|Custom emitter for .* not found|"
            r"UNIMPLEMENTED|Unexpected operand type for|not supported on|"
            r"disallowed (?:op|custom call|dialect)|custom call target .* not allowed|"
            r"op count .* exceeds|Unsupported op",
            re.IGNORECASE,
        ),
        _unsupported,
    ),
    (
        re.compile(
            r"(?:Shape|Dtype|Rank) mismatch for|pytree structure|"
            r"missing (?:argument|tensor)|unexpected (?:argument|tensor)|"
            r"needs concrete shapes|wrong number of arguments",
            re.IGNORECASE,
        ),
        _simple(Category.BAD_ARGUMENTS),
    ),
    (
        re.compile(
            r"unpack_from requires a buffer|struct\.error|Failed to deserialize|"
            r"flatbuffer|Unsupported buffer|invalid magic|bad magic|"
            r"could not parse|not a tpumarket|ProgramFormatError|"
            r"exceeds the cap|Invalid (?:bytecode|flatbuffer)",
            re.IGNORECASE,
        ),
        _simple(Category.MALFORMED_INPUT),
    ),
    (
        re.compile(r"timed? ?out|deadline exceeded", re.IGNORECASE),
        lambda text, stage: diagnose(
            Category.EXECUTE_TIMEOUT if stage is Stage.EXECUTE else Category.COMPILE_TIMEOUT,
            text,
            stage=stage,
        ),
    ),
)

_FALLBACK: Final[dict[Stage, Category]] = {
    Stage.PARSE: Category.MALFORMED_INPUT,
    Stage.VALIDATE: Category.MALFORMED_INPUT,
    Stage.COMPILE: Category.UNSUPPORTED_OP,
    Stage.EXECUTE: Category.EXECUTE_ERROR,  # the worker raised and lives: no crash
}


def classify(text: str, stage: Stage) -> Diagnosis:
    """Classify an error message raised at ``stage``; unknown messages fall back by stage."""
    for pattern, build in _RULES:
        if pattern.search(text):
            return build(text, stage)
    if stage is Stage.COMPILE:  # the compiler's own words: its hints, not the custom calls'
        match = _NAMED_OP.search(text)
        return diagnose(
            Category.UNSUPPORTED_OP,
            text,
            stage=stage,
            op=None if match is None else match["op"],
            hints=COMPILER_ERROR_HINTS if match is None else MISSING_OP_HINTS,
        )
    return diagnose(_FALLBACK[stage], text, stage=stage)


def timeout(stage: Stage, seconds: float) -> Diagnosis:
    """Diagnose a task the parent killed because ``stage`` overran its limit."""
    category = {
        Stage.EXECUTE: Category.EXECUTE_TIMEOUT,
        Stage.COMPILE: Category.COMPILE_TIMEOUT,
    }.get(stage, Category.MALFORMED_INPUT)
    what = "parsing and validating the program" if category is Category.MALFORMED_INPUT else stage
    return diagnose(category, f"{what} did not finish within {seconds:g} s", stage=stage)


_SIGNAL_NAMES: Final = {6: "SIGABRT", 7: "SIGBUS", 9: "SIGKILL", 11: "SIGSEGV", 24: "SIGXCPU"}


def crash(stage: Stage, exitcode: int | None) -> Diagnosis:
    """Diagnose a worker that died while running ``stage`` (negative exit code = signal).

    The hint follows what the parent saw: a memory fault while compiling (the compiler's
    stack, e.g. a program nested too deep), a kill from outside (memory), the CPU-time
    limit, or else a runtime crash.
    """
    signal = -exitcode if exitcode is not None and exitcode < 0 else None
    hints: tuple[str, ...] | None = None
    if signal is not None:
        name = _SIGNAL_NAMES.get(signal)
        how = f"killed by signal {signal}" + (f" ({name})" if name else "")
        if signal in (7, 11) and stage is Stage.COMPILE:
            hints = COMPILER_CRASH_HINTS
        elif signal == 9:
            hints = KILLED_HINTS
        elif signal == 24:
            hints = CPU_LIMIT_HINTS
    else:
        how = f"exited with code {exitcode}"
    return diagnose(Category.WORKER_CRASH, f"worker {how} during {stage}", stage=stage, hints=hints)


__all__ = [
    "COMPILER_CRASH_HINTS",
    "COMPILER_ERROR_HINTS",
    "CPU_LIMIT_HINTS",
    "F64_ON_TPU_HINTS",
    "HINTS",
    "HINT_SETS",
    "KILLED_HINTS",
    "MAX_MESSAGE_CHARS",
    "MISSING_OP_HINTS",
    "NESTING_HINTS",
    "OP_COUNT_HINTS",
    "OUTPUT_DTYPE_HINTS",
    "SORT_COMPARATOR_HINTS",
    "SUCCESS_CODE",
    "VERIFIER_HINTS",
    "Category",
    "Diagnosis",
    "Stage",
    "classify",
    "crash",
    "diagnose",
    "first_meaningful_line",
    "hint_set_name",
    "parse_size",
    "timeout",
]
