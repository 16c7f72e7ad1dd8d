"""Checks of a task's arguments against its program's exported signature.

Runs in the worker on what ``jax.export`` deserialized (``in_avals``); imports no JAX itself.
Inputs are never cast: an argument whose dtype differs from the program's is refused like any
other mismatch, float64 into a float32 program included. The program's own dtype rules (wide
dtypes on a TPU, deliverable results) are :mod:`programs.dtypes`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from programs.refusals import Category, RejectedProgram

Spec = tuple[tuple[int, ...], str]


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
