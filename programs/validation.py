"""A program checked as a provider checks it: stated versions, the program itself, its ops.

The steps a provider's worker takes (:class:`provider.sandbox.validation.ProgramValidator`)
and that the client's export takes on the program it wrote, so that a program no provider
runs never leaves the client's machine. JAX is imported only where a program is deserialized.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from programs.dtypes import check_result_dtypes, check_wide_dtypes
from programs.envelope import ProgramEnvelope
from programs.opwalk import walk_module
from programs.refusals import Category, RejectedProgram
from programs.rules import (
    DEFAULT_MAX_NESTING,
    DEFAULT_MAX_OPS,
    VersionRanges,
    artifact_stablehlo_version,
    check_calling_convention,
    check_producer_jax,
    check_stablehlo,
)


class UnreadableProgram(RejectedProgram):
    """``jax.export`` could not deserialize the program (its worker is not trusted after)."""


def check_stated(envelope: ProgramEnvelope, ranges: VersionRanges) -> None:
    """Refuse an envelope whose stated producer JAX or calling convention is out of range."""
    check_producer_jax(envelope.producer.jax, ranges)
    check_calling_convention(envelope.producer.calling_convention, ranges)


def deserialize(jax: Any, program: bytes) -> Any:
    """Return ``jax.export.deserialize`` of ``program``; refuse bytes it cannot read."""
    try:
        return jax.export.deserialize(bytearray(program))
    except Exception as exc:
        raise UnreadableProgram(
            Category.MALFORMED_INPUT,
            f"cannot deserialize the Exported flatbuffer: {type(exc).__name__}: {exc}",
        ) from exc


def check_exported(envelope: ProgramEnvelope, exported: Any, ranges: VersionRanges) -> None:
    """Refuse a program whose own versions are out of range or differ from its envelope's."""
    check_calling_convention(exported.calling_convention_version, ranges)
    if exported.calling_convention_version != envelope.producer.calling_convention:
        raise RejectedProgram(
            Category.MALFORMED_INPUT,
            "envelope states calling convention "
            f"{envelope.producer.calling_convention} but the program has "
            f"{exported.calling_convention_version}",
        )
    check_stablehlo(artifact_stablehlo_version(exported.mlir_module_serialized), ranges)
    if tuple(exported.platforms) != tuple(envelope.platforms):
        raise RejectedProgram(
            Category.MALFORMED_INPUT,
            f"envelope states platforms {envelope.platforms} but the program was "
            f"exported for {tuple(exported.platforms)}",
        )


@dataclass(frozen=True, slots=True)
class ProgramCheck:
    """A program some provider runs: its op count, and the platforms whose providers refuse it."""

    op_count: int
    refused_on: dict[str, RejectedProgram] = field(default_factory=dict)


def check_program(
    envelope: ProgramEnvelope,
    ranges: VersionRanges,
    *,
    max_ops: int = DEFAULT_MAX_OPS,
    max_nesting: int = DEFAULT_MAX_NESTING,
) -> ProgramCheck:
    """Check ``envelope`` as a provider with ``ranges`` and these caps would; raise
    :class:`RejectedProgram` when no provider runs it on any platform it was exported for.

    The order is a worker's: stated versions, the program, the platform's own rules (a
    float64 program on a TPU), deliverable results, then every op. A refusal on some of the
    program's platforms only is returned in :attr:`ProgramCheck.refused_on`.
    """
    import jax

    check_stated(envelope, ranges)
    exported = deserialize(jax, envelope.program)
    check_exported(envelope, exported, ranges)
    refused: dict[str, RejectedProgram] = {}
    for platform in exported.platforms:
        try:
            check_wide_dtypes(exported, str(platform), f"a {platform} target")
        except RejectedProgram as exc:
            refused[str(platform)] = exc
    if len(refused) == len(exported.platforms):
        raise next(iter(refused.values()))
    check_result_dtypes(exported)
    count = walk_module(exported, max_ops, max_nesting)
    return ProgramCheck(op_count=count, refused_on=refused)
