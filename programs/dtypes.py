"""A program's dtype rules: what a TPU has no arithmetic for, what its outputs' format carries.

Pure: reads the ``in_avals``/``out_avals`` that ``jax.export`` deserialized, imports no JAX.
"""

from __future__ import annotations

from typing import Any

from programs.hints import F64_ON_TPU_HINTS, OUTPUT_DTYPE_HINTS
from programs.refusals import Category, RejectedProgram

WIDE_DTYPES = frozenset({"float64", "complex128"})
"""Dtypes a TPU has no arithmetic for."""


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
