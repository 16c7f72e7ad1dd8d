"""The rules a provider checks a program against: versions, dialects, ops, sorts, size, depth.

Nothing here imports JAX, so the rules can be read and tested on their own; a provider's
worker and the client's export feed them what they read from the program (see
:mod:`programs.opwalk`). Custom calls have their own rules (:mod:`programs.custom_calls`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from programs.custom_calls import is_allowed_target
from programs.hints import NESTING_HINTS, OP_COUNT_HINTS, SORT_COMPARATOR_HINTS
from programs.refusals import Category, RejectedProgram

ARTIFACT_MAGIC: Final = b"ML\xefR"
_PRODUCER = re.compile(rb"StableHLO_v(\d+)\.(\d+)\.(\d+)\x00")
_VERSION = re.compile(r"^(\d+)\.(\d+)\.(\d+)")

DEFAULT_MAX_OPS: Final = 8000
"""A daemon's op cap per program unless its operator sets another (``SandboxLimits``)."""
DEFAULT_MAX_NESTING: Final = 64
"""A daemon's nesting cap unless its operator sets another: regions in regions, through the
functions they call. XLA's compiler recurses per level and a valid program ~100 levels deep
overflows a worker's stack (docs/provider-api.md)."""

ALLOWED_DIALECTS: Final = frozenset({"func", "stablehlo", "chlo", "sdy"})
FORBIDDEN_OPS: Final = frozenset(
    {
        "stablehlo.infeed",
        "stablehlo.outfeed",
        "stablehlo.send",
        "stablehlo.recv",
    }
)


def parse_version(text: str) -> tuple[int, int, int]:
    """Parse the leading ``X.Y.Z`` of a version string (``0.10.2``, ``1.15.0.dev1``)."""
    match = _VERSION.match(text.strip())
    if match is None:
        raise RejectedProgram(Category.MALFORMED_INPUT, f"unparseable version {text!r}")
    return int(match[1]), int(match[2]), int(match[3])


def artifact_stablehlo_version(module_bytes: bytes) -> tuple[int, int, int]:
    """Read the StableHLO version a portable artifact was written for, from its header."""
    if not module_bytes.startswith(ARTIFACT_MAGIC):
        raise RejectedProgram(
            Category.MALFORMED_INPUT, "program module is not a StableHLO portable artifact"
        )
    match = _PRODUCER.match(module_bytes, len(ARTIFACT_MAGIC) + 1)
    if match is None:
        raise RejectedProgram(
            Category.MALFORMED_INPUT, "portable artifact has no StableHLO producer version"
        )
    return int(match[1]), int(match[2]), int(match[3])


@dataclass(frozen=True, slots=True)
class VersionRanges:
    """What a provider accepts; its workers read it from their own JAX (`installed_ranges`)."""

    jax: tuple[int, int, int]
    calling_convention_min: int
    calling_convention_max: int
    stablehlo_min: tuple[int, int, int]
    stablehlo_max: tuple[int, int, int]


def installed_ranges() -> VersionRanges:
    """Return the ranges the JAX installed here accepts (a worker's own; the export's default).

    Imports JAX: call it only where JAX is meant to be loaded.
    """
    import jax
    from jax import export
    from jax.extend.mlir.dialects import stablehlo

    return VersionRanges(
        jax=parse_version(jax.__version__),
        calling_convention_min=export.minimum_supported_calling_convention_version,
        calling_convention_max=export.maximum_supported_calling_convention_version,
        stablehlo_min=parse_version(stablehlo.get_minimum_version()),
        stablehlo_max=parse_version(stablehlo.get_current_version()),
    )


def ranges_to_wire(ranges: VersionRanges) -> dict[str, Any]:
    """Return version ranges as JSON-able data (a worker's ready message carries them)."""
    return {
        "jax": list(ranges.jax),
        "calling_convention_min": ranges.calling_convention_min,
        "calling_convention_max": ranges.calling_convention_max,
        "stablehlo_min": list(ranges.stablehlo_min),
        "stablehlo_max": list(ranges.stablehlo_max),
    }


def ranges_from_wire(wire: Mapping[str, Any]) -> VersionRanges | None:
    """Read :func:`ranges_to_wire` data (None when absent or malformed)."""

    def triple(value: Any) -> tuple[int, int, int]:
        first, second, third = (int(part) for part in value)
        return first, second, third

    try:
        return VersionRanges(
            jax=triple(wire["jax"]),
            calling_convention_min=int(wire["calling_convention_min"]),
            calling_convention_max=int(wire["calling_convention_max"]),
            stablehlo_min=triple(wire["stablehlo_min"]),
            stablehlo_max=triple(wire["stablehlo_max"]),
        )
    except (KeyError, TypeError, ValueError):
        return None


def _dotted(version: tuple[int, int, int]) -> str:
    return ".".join(str(part) for part in version)


def check_producer_jax(producer_jax: str, ranges: VersionRanges) -> None:
    """Reject programs exported by a JAX newer than the provider's."""
    if parse_version(producer_jax) > ranges.jax:
        raise RejectedProgram(
            Category.VERSION_MISMATCH,
            f"program exported by jax {producer_jax}, newer than the provider's jax "
            f"{_dotted(ranges.jax)}",
        )


def check_calling_convention(version: int, ranges: VersionRanges) -> None:
    """Reject a calling-convention version outside the provider's range."""
    if not ranges.calling_convention_min <= version <= ranges.calling_convention_max:
        raise RejectedProgram(
            Category.VERSION_MISMATCH,
            f"calling convention version {version} outside the supported range "
            f"[{ranges.calling_convention_min}..{ranges.calling_convention_max}]",
        )


def check_stablehlo(version: tuple[int, int, int], ranges: VersionRanges) -> None:
    """Reject a StableHLO artifact version outside the provider's range."""
    if not ranges.stablehlo_min <= version <= ranges.stablehlo_max:
        raise RejectedProgram(
            Category.VERSION_MISMATCH,
            f"StableHLO version {_dotted(version)} outside the supported range "
            f"[{_dotted(ranges.stablehlo_min)}..{_dotted(ranges.stablehlo_max)}]",
        )


def check_op(name: str, custom_call_target: str | None) -> None:
    """Reject an op from a foreign dialect, a forbidden op, or a custom call off the list."""
    dialect = name.split(".", 1)[0]
    if dialect not in ALLOWED_DIALECTS:
        raise RejectedProgram(Category.UNSUPPORTED_OP, f"disallowed dialect in op {name}", op=name)
    if name in FORBIDDEN_OPS:
        raise RejectedProgram(Category.UNSUPPORTED_OP, f"disallowed op {name}", op=name)
    if name == "stablehlo.custom_call":
        target = custom_call_target or ""
        if not is_allowed_target(target):
            raise RejectedProgram(
                Category.UNSUPPORTED_OP,
                f"disallowed custom call target {target!r} (host callbacks, Pallas/Mosaic "
                "kernels, GPU solver kernels and other opaque targets are not accepted)",
                op=target or name,
            )


NON_STRICT_DIRECTIONS = frozenset({"LE", "GE", "EQ", "NE"})
"""Comparisons that are no strict weak order: ``a <= a`` holds, and ``!=`` is symmetric."""


def check_sort_comparator(chain: Sequence[tuple[str, str]]) -> None:
    """Reject a sort whose comparator is, where it can be told, not a strict weak order.

    ``chain`` names what the comparator returns: the op that makes the value and its detail
    (a compare's direction, a constant's value), then the op that makes that op's first
    operand. Refused: a single ``compare`` LE/GE/EQ/NE, a constant ``true``, and the negation
    of a ``compare`` LT/GT (which is GE/LE).
    """
    if not chain:
        return
    name, detail = chain[0]
    said = ""
    if name == "stablehlo.compare" and detail in NON_STRICT_DIRECTIONS:
        said = f"a single compare {detail}"
    elif name == "stablehlo.constant" and "true" in detail:
        said = "a constant true"
    elif name == "stablehlo.not" and len(chain) > 1:
        inner, direction = chain[1]
        if inner == "stablehlo.compare" and direction in ("LT", "GT"):
            said = f"the negation of a compare {direction}"
    if said:
        raise RejectedProgram(
            Category.UNSUPPORTED_OP,
            f"sort comparator is not a strict weak order (it returns {said})",
            op="stablehlo.sort",
            hints=SORT_COMPARATOR_HINTS,
        )


def check_op_count(count: int, limit: int, *, counted_all: bool = True) -> None:
    """Reject a module with more ops than the cap; ``counted_all``: ``count`` is the total
    (else the count stopped there and the module has at least that many)."""
    if count > limit:
        how_many = f"{count}" if counted_all else f"at least {count}"
        raise RejectedProgram(
            Category.UNSUPPORTED_OP,
            f"op count {how_many} exceeds the cap of {limit} ops per program",
            hints=OP_COUNT_HINTS,
        )


def check_nesting(depth: int, limit: int) -> None:
    """Reject a module nested deeper than the cap (``depth`` is ``limit + 1`` when counting
    stopped past it): a valid program, refused before the compiler overflows its stack."""
    if depth > limit:
        raise RejectedProgram(
            Category.UNSUPPORTED_OP,
            f"the program nests control flow and calls more than {limit} levels deep (this "
            f"provider's cap: XLA's compiler recurses once per level)",
            op="nesting depth",
            hints=NESTING_HINTS,
        )
