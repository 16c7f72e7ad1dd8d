"""Failure diagnosis: turn an error message and the stage it came from into a category.

Pure rules, no JAX import: the sandbox feeds it the text of whatever a worker raised, or
builds a diagnosis directly for what the parent observed (a timeout, a dead worker). Receipts
carry :attr:`Diagnosis.code` on chain, so the codes are stable: never renumber them.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Final

SUCCESS_CODE: Final = 0
MAX_MESSAGE_CHARS: Final = 500


class Category(StrEnum):
    """Why a task failed."""

    MALFORMED_INPUT = "malformed_input"
    VERSION_MISMATCH = "version_mismatch"
    PLATFORM_MISMATCH = "platform_mismatch"
    DEVICE_COUNT_MISMATCH = "device_count_mismatch"
    UNSUPPORTED_OP = "unsupported_op"
    OOM = "oom"
    BAD_ARGUMENTS = "bad_arguments"
    COMPILE_TIMEOUT = "compile_timeout"
    EXECUTE_TIMEOUT = "execute_timeout"
    WORKER_CRASH = "worker_crash"
    EXECUTE_ERROR = "execute_error"

    @property
    def code(self) -> int:
        """Return the stable on-chain code of this category (1..11; 0 means success)."""
        return _CODES[self]

    @classmethod
    def from_code(cls, code: int) -> Category:
        """Return the category with this on-chain code."""
        for category, value in _CODES.items():
            if value == code:
                return category
        raise ValueError(f"no failure category has code {code}")


_CODES: Final[dict[Category, int]] = {
    Category.MALFORMED_INPUT: 1,
    Category.VERSION_MISMATCH: 2,
    Category.PLATFORM_MISMATCH: 3,
    Category.DEVICE_COUNT_MISMATCH: 4,
    Category.UNSUPPORTED_OP: 5,
    Category.OOM: 6,
    Category.BAD_ARGUMENTS: 7,
    Category.COMPILE_TIMEOUT: 8,
    Category.EXECUTE_TIMEOUT: 9,
    Category.WORKER_CRASH: 10,
    Category.EXECUTE_ERROR: 11,
}


class Stage(StrEnum):
    """Where in a task's life a failure happened."""

    PARSE = "parse"
    VALIDATE = "validate"
    COMPILE = "compile"
    EXECUTE = "execute"


HINTS: Final[dict[Category, tuple[str, ...]]] = {
    Category.MALFORMED_INPUT: (
        "Send the bytes of jax.export.Exported.serialize() unmodified, inside a program "
        "envelope whose hashes match.",
        "Send arguments as safetensors or an npz without object arrays.",
    ),
    Category.VERSION_MISMATCH: (
        "Export with a JAX version within the provider's advertised range, or pin "
        "the calling-convention version with jax.export's default for that version.",
        "Upgrade the exporter if the provider needs a newer calling convention.",
    ),
    Category.PLATFORM_MISMATCH: (
        "Export for the provider's platform: jax.export.export(f, platforms=('tpu',)) for "
        "a TPU target, or list several platforms to run anywhere.",
    ),
    Category.DEVICE_COUNT_MISMATCH: (
        "Export with a mesh of the target's device count, or pick a target topology with "
        "as many devices as the program was exported for.",
    ),
    Category.UNSUPPORTED_OP: (
        "Rewrite the op with XLA-friendly primitives (jax.numpy / jax.lax) instead of custom "
        "calls, host callbacks or hand-written kernels.",
        "Avoid ops the target lacks (e.g. LAPACK-backed linalg on TPU, f64/c128 on TPU).",
    ),
    Category.OOM: (
        "Lower the batch size or sequence length.",
        "Use mixed precision (bfloat16 weights and activations).",
        "Shard the model over more devices, or pick a target with more memory.",
        "Rematerialize activations (jax.checkpoint) to cut temporaries.",
    ),
    Category.BAD_ARGUMENTS: (
        "Send one tensor per flat argument, named by its index, with the exported shapes "
        "and dtypes.",
    ),
    Category.COMPILE_TIMEOUT: (
        "Shrink the program: use lax.scan or fori_loop instead of unrolled Python loops.",
        "Split the model into smaller exported functions.",
    ),
    Category.EXECUTE_TIMEOUT: (
        "Lower the batch size or split the work into several tasks.",
        "Check for loops whose trip count depends on the data.",
    ),
    Category.WORKER_CRASH: (
        "The program crashed the runtime (only its own worker died): export it with jax.export "
        "from unedited JAX code and check it runs locally on the same JAX version.",
    ),
    Category.EXECUTE_ERROR: (
        "The program raised an error while it ran (the runtime survived): run it locally "
        "with the same inputs and check its runtime assertions.",
    ),
}
OP_COUNT_HINTS: Final = (
    "Shrink the program: use lax.scan or fori_loop instead of unrolled Python loops.",
    "Split the model into smaller exported functions, one task each.",
)
"""Hints of a program refused for having more ops than the provider's cap."""
F64_ON_TPU_HINTS: Final = (
    "TPUs have no float64 or complex128: cast to float32 (or bfloat16) and complex64 before "
    "exporting, or run the program on a CPU or GPU provider.",
)
"""Hints of a program that needs 64-bit floats on a TPU target."""
OUTPUT_DTYPE_HINTS: Final = (
    "Return complex128 results as two float64 arrays (jnp.real, jnp.imag), and sub-byte "
    "integers widened to int8.",
)
"""Hints of a program whose results have a dtype the outputs' format cannot carry."""
SORT_COMPARATOR_HINTS: Final = (
    "Give sort a strict comparator (a < b or a > b, as jnp.sort and lax.sort's own are): "
    "XLA's CPU sort reads outside its buffer when comp(a, a) is true.",
)
"""Hints of a sort refused for a comparator that is no strict weak order."""
HINT_SETS: Final[dict[str, tuple[str, ...]]] = {
    "op_count": OP_COUNT_HINTS,
    "sort_comparator": SORT_COMPARATOR_HINTS,
    "f64_on_tpu": F64_ON_TPU_HINTS,
    "output_dtype": OUTPUT_DTYPE_HINTS,
}
"""Hints other than a category's own, by the name a worker sends them under (no free text)."""


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


def _unsupported(text: str, stage: Stage) -> Diagnosis:
    match = _CUSTOM_TARGET.search(text) or _NAMED_OP.search(text)
    return diagnose(
        Category.UNSUPPORTED_OP, text, stage=stage, op=None if match is None else match["op"]
    )


def _simple(category: Category) -> Callable[[str, Stage], Diagnosis]:
    def build(text: str, stage: Stage) -> Diagnosis:
        return diagnose(category, text, stage=stage)

    return build


# Ordered: the first rule whose pattern matches anywhere in the text wins.
_RULES: Final[tuple[tuple[re.Pattern[str], Callable[[str, Stage], Diagnosis]], ...]] = (
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
    return diagnose(_FALLBACK[stage], text, stage=stage)


def timeout(stage: Stage, seconds: float) -> Diagnosis:
    """Diagnose a task the parent killed because ``stage`` overran its limit."""
    category = {
        Stage.EXECUTE: Category.EXECUTE_TIMEOUT,
        Stage.COMPILE: Category.COMPILE_TIMEOUT,
    }.get(stage, Category.MALFORMED_INPUT)
    what = "parsing and validating the program" if category is Category.MALFORMED_INPUT else stage
    return diagnose(category, f"{what} did not finish within {seconds:g} s", stage=stage)


def crash(stage: Stage, exitcode: int | None) -> Diagnosis:
    """Diagnose a worker that died while running ``stage`` (negative exit code = signal)."""
    if exitcode is not None and exitcode < 0:
        how = f"killed by signal {-exitcode}"
    else:
        how = f"exited with code {exitcode}"
    return diagnose(Category.WORKER_CRASH, f"worker {how} during {stage}", stage=stage)
