"""Pure validation rules for untrusted programs: versions, dialects, ops, custom calls.

Nothing here imports JAX, so the rules can be read and tested on their own; the worker feeds
them what it reads from the blob (see :mod:`provider.sandbox.opwalk`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final

from provider.diagnosis import Category
from provider.errors import ProviderError

ARTIFACT_MAGIC: Final = b"ML\xefR"
_PRODUCER = re.compile(rb"StableHLO_v(\d+)\.(\d+)\.(\d+)\x00")
_VERSION = re.compile(r"^(\d+)\.(\d+)\.(\d+)")

ALLOWED_DIALECTS: Final = frozenset({"func", "stablehlo", "chlo", "sdy"})
FORBIDDEN_OPS: Final = frozenset(
    {
        "stablehlo.infeed",
        "stablehlo.outfeed",
        "stablehlo.send",
        "stablehlo.recv",
    }
)
# Custom calls that compile to XLA-owned code: sharding annotations, shape assertions and
# the LAPACK / solver kernels that jax.numpy.linalg lowers to. Deliberately absent: host
# callbacks (xla_python_*_callback, xla_ffi_python_*), Pallas/Mosaic kernels
# (tpu_custom_call, mosaic_gpu*), Triton, and tf.call_tf_function.
ALLOWED_CUSTOM_CALLS: Final = frozenset(
    {
        "AllocateBuffer",
        "ApproxTopK",
        "Eigh",
        "LuDecomposition",
        "ProductOfElementaryHouseholderReflectors",
        "Qr",
        "SPMDFullToShardShape",
        "SPMDShardToFullShape",
        "Sharding",
        "annotate_device_placement",
        "cu_lu_pivots_to_permutation",
        "cu_threefry2x32_ffi",
        "hip_lu_pivots_to_permutation",
        "hip_threefry2x32_ffi",
        "shape_assertion",
        "stablehlo.dynamic_approx_top_k",
        "stablehlo.dynamic_reduce_window",
        "stablehlo.dynamic_rng_bit_generator",
        "stablehlo.dynamic_top_k",
    }
)
_SOLVER_KERNEL = re.compile(
    r"^(?:lapack_[sdcz]|cusolver_|hipsolver_|cusparse_)"
    r"(?:gees|geev|gehrd|geqrf|gesdd|gesvd|gesvdj|getrf|gtsv|gtsv2|heevd|hetrd|orgqr|"
    r"ungqr|potrf|syevd|sytrd|trsm)_ffi$"
)


class RejectedProgram(ProviderError):
    """Raised inside the worker when a program fails a rule; ``category`` names which kind."""

    def __init__(self, category: Category, message: str, op: str | None = None) -> None:
        """Record why the program was refused."""
        super().__init__(message)
        self.category = category
        self.op = op


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
    """What this provider accepts; the worker fills it from its own JAX."""

    jax: tuple[int, int, int]
    calling_convention_min: int
    calling_convention_max: int
    stablehlo_min: tuple[int, int, int]
    stablehlo_max: tuple[int, int, int]


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
        if target not in ALLOWED_CUSTOM_CALLS and not _SOLVER_KERNEL.match(target):
            raise RejectedProgram(
                Category.UNSUPPORTED_OP,
                f"disallowed custom call target {target!r} (host callbacks, Pallas/Mosaic "
                "kernels and other opaque targets are not accepted)",
                op=target or name,
            )


def check_op_count(count: int, limit: int) -> None:
    """Reject a module with more ops than the cap."""
    if count > limit:
        raise RejectedProgram(
            Category.UNSUPPORTED_OP, f"op count {count} exceeds the cap of {limit} ops per program"
        )
