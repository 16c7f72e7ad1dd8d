"""What the envelope alone says a worker would refuse: checked in the parent before the ack.

Pure (no JAX): the versions a program states (its producer's JAX, its calling convention,
the StableHLO version in its artifact's header) against the ranges the workers reported
when they came up, and the platforms it was exported for against where it would run. Each
rule is the worker's own (:mod:`programs.rules`, :class:`ProgramValidator`), so
nothing a worker would accept is refused here; a refusal here bills nothing.
"""

from __future__ import annotations

from typing import Final

from programs.envelope import ProgramEnvelope
from programs.refusals import Category, RejectedProgram
from programs.rules import (
    ARTIFACT_MAGIC,
    VersionRanges,
    artifact_stablehlo_version,
    check_calling_convention,
    check_producer_jax,
    check_stablehlo,
    parse_version,
    ranges_from_wire,
    ranges_to_wire,
)
from provider.sandbox.targets import EXPORT_PLATFORM_ALIASES

REFUSAL_CODES: Final = {
    Category.VERSION_MISMATCH: "version_unsupported",
    Category.PLATFORM_MISMATCH: "platform_unsupported",
}
"""The refusal code of each category refused before the ack (anything else: malformed)."""


def _stated_stablehlo(program: bytes) -> tuple[int, int, int] | None:
    """The StableHLO version in the header of the artifact inside ``program``, if found."""
    at = program.find(ARTIFACT_MAGIC)
    if at < 0:
        return None
    try:
        return artifact_stablehlo_version(program[at : at + 64])
    except RejectedProgram:
        return None  # the worker reads the module itself and says what is wrong


def envelope_refusal(
    envelope: ProgramEnvelope, platform: str | None, ranges: VersionRanges | None
) -> tuple[str, str] | None:
    """Return (code, reason) when a worker would refuse ``envelope`` for what it states.

    ``platform`` is where the program would run (``tpu`` for an AOT target, else the
    workers' platform); ``ranges`` the workers' versions. Either may be None (not known yet):
    its checks are then left to the worker.
    """
    try:
        if ranges is not None:
            parse_version(envelope.producer.jax)
            check_producer_jax(envelope.producer.jax, ranges)
            check_calling_convention(envelope.producer.calling_convention, ranges)
            stated = _stated_stablehlo(envelope.program)
            if stated is not None:
                check_stablehlo(stated, ranges)
        if platform is not None:
            accepted = EXPORT_PLATFORM_ALIASES.get(platform, (platform,))
            if not any(p in accepted for p in envelope.platforms):
                raise RejectedProgram(
                    Category.PLATFORM_MISMATCH,
                    f"the program was exported for platforms {tuple(envelope.platforms)}; "
                    f"this task would run it on {platform} (export with platforms="
                    f"{accepted!r}, or list several platforms)",
                )
    except RejectedProgram as exc:
        return REFUSAL_CODES.get(exc.category, "envelope_malformed"), str(exc)
    return None


__all__ = [
    "REFUSAL_CODES",
    "envelope_refusal",
    "ranges_from_wire",
    "ranges_to_wire",
]
