"""Checks of a program's arguments and dtypes against its exported signature and target.

Runs in the worker on what ``jax.export`` deserialized (``in_avals``, ``out_avals``); imports
no JAX itself. Inputs are never cast: an argument whose dtype differs from the program's is
refused like any other mismatch, float64 into a float32 program included.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from provider.diagnosis import F64_ON_TPU_HINTS, OUTPUT_DTYPE_HINTS, Category
from provider.sandbox.checks import RejectedProgram

Spec = tuple[tuple[int, ...], str]
WIDE_DTYPES = frozenset({"float64", "complex128"})
"""Dtypes a TPU has no arithmetic for."""


def argument_specs(avals: Sequence[Any], arguments: Mapping[str, Any] | None) -> list[Spec]:
    """Return the (shape, dtype) each argument is compiled for; refuse what does not fit.

    Without ``arguments`` the exported shapes are used (they must be concrete). With them,
    each flat argument index needs one tensor of the exported dtype and rank whose static
    dimensions match (symbolic ones take the tensor's size).
    """
    if arguments is None:
        specs = []
        for i, aval in enumerate(avals):
            if not all(isinstance(d, int) for d in aval.shape):
                raise RejectedProgram(
                    Category.BAD_ARGUMENTS,
                    f"argument {i} has symbolic shape {aval.str_short()}: the compile needs "
                    "concrete shapes; send example inputs",
                )
            specs.append((tuple(aval.shape), str(aval.dtype)))
        return specs
    expected = {str(i) for i in range(len(avals))}
    missing = sorted(expected - set(arguments), key=int)
    extra = sorted(set(arguments) - expected)
    if missing or extra:
        raise RejectedProgram(
            Category.BAD_ARGUMENTS,
            f"wrong number of arguments: missing tensors {missing}, unexpected "
            f"tensors {extra}; name tensors by flat argument index 0..{len(avals) - 1}",
        )
    specs = []
    for i, aval in enumerate(avals):
        value = arguments[str(i)]
        shape, dtype = tuple(int(d) for d in value.shape), str(value.dtype)
        want = str(aval.dtype)
        if dtype != want:
            raise RejectedProgram(
                Category.BAD_ARGUMENTS,
                f"Dtype mismatch for argument {i}: the program takes {want} and was sent "
                f"{dtype}; inputs are never cast, send {want}",
            )
        dims = tuple(aval.shape)
        if len(dims) != len(shape) or any(
            isinstance(d, int) and d != got for d, got in zip(dims, shape, strict=True)
        ):
            raise RejectedProgram(
                Category.BAD_ARGUMENTS,
                f"Shape mismatch for argument {i}: the program takes {aval.str_short()} and "
                f"was sent {dtype}{list(shape)}",
            )
        specs.append((shape, dtype))
    return specs


def check_wide_dtypes(exported: Any, platform: str, where: str) -> None:
    """Refuse a program with float64 or complex128 arguments or results on a TPU target."""
    if platform != "tpu":
        return
    for kind, avals in (("argument", exported.in_avals), ("result", exported.out_avals)):
        for i, aval in enumerate(avals):
            if str(aval.dtype) in WIDE_DTYPES:
                raise RejectedProgram(
                    Category.UNSUPPORTED_OP,
                    f"Unsupported dtype {aval.dtype} on {where}: {kind} {i} is "
                    f"{aval.str_short()}, and a TPU has no {aval.dtype} arithmetic",
                    op=str(aval.dtype),
                    hints=F64_ON_TPU_HINTS,
                )


DELIVERABLE_DTYPES = frozenset(
    {
        "bool",
        "int8",
        "uint8",
        "int16",
        "uint16",
        "int32",
        "uint32",
        "int64",
        "uint64",
        "float16",
        "float32",
        "float64",
        "bfloat16",
        "float8_e4m3fn",
        "float8_e4m3fnuz",
        "float8_e5m2",
        "float8_e5m2fnuz",
        "complex64",
    }
)
"""Result dtypes the outputs' format (safetensors) carries to the client."""


def check_result_dtypes(exported: Any) -> None:
    """Refuse, before compiling, a program whose results could not be delivered."""
    for i, aval in enumerate(exported.out_avals):
        if str(aval.dtype) not in DELIVERABLE_DTYPES:
            raise RejectedProgram(
                Category.UNSUPPORTED_OP,
                f"Unsupported output dtype {aval.dtype}: result {i} is {aval.str_short()}, "
                "which the outputs' format (safetensors) cannot carry",
                op=str(aval.dtype),
                hints=OUTPUT_DTYPE_HINTS,
            )
