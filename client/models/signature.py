"""What an exported program takes and returns, by flat argument index; pure (numpy only).

A program's flat arguments are split in two sections: *weights* (fixed, sent once, hashed
with the inputs) and *inputs* (per task). Both are named by flat index, so tensor ``"3"`` is
flat argument 3 of the exported function. A dimension is an ``int`` or the name of a symbolic
dimension (``"batch"``); one name binds to one size across all the inputs of a task.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from client.errors import ProgramInputsError, ProgramOutputsError

Array = npt.NDArray[Any]
Dim = int | str


@dataclass(frozen=True, slots=True)
class TensorSpec:
    """One flat argument or result: its flat index, a human label, shape and dtype."""

    index: int
    label: str
    shape: tuple[Dim, ...]
    dtype: str

    @property
    def key(self) -> str:
        """Return the tensor's name in the safetensors files (its flat index)."""
        return str(self.index)

    @property
    def is_concrete(self) -> bool:
        """Return whether every dimension is a plain integer."""
        return all(isinstance(d, int) for d in self.shape)

    def describe(self) -> str:
        """Return ``label[shape]:dtype`` for messages."""
        dims = ",".join(str(d) for d in self.shape)
        return f"{self.label}[{dims}]:{self.dtype}"


@dataclass(frozen=True, slots=True)
class ProgramSignature:
    """The flat arguments (weights, then inputs) and flat results of an exported program."""

    weights: tuple[TensorSpec, ...]
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]

    @classmethod
    def from_avals(
        cls,
        in_avals: Sequence[tuple[Sequence[Dim], str]],
        out_avals: Sequence[tuple[Sequence[Dim], str]],
        *,
        weights: int,
    ) -> ProgramSignature:
        """Return the signature of a program taking ``in_avals`` (shape, dtype) flat, the first
        ``weights`` of them its weights; labels are the positions among their kind
        (``weight0``, ``input0``, ``output0``: the names ``job export`` prints, while
        :attr:`TensorSpec.key`, the name in the inputs file, is the flat position)."""

        def spec(index: int, label: str, aval: tuple[Sequence[Dim], str]) -> TensorSpec:
            return TensorSpec(index, label, tuple(aval[0]), aval[1])

        return cls(
            weights=tuple(spec(i, f"weight{i}", a) for i, a in enumerate(in_avals[:weights])),
            inputs=tuple(
                spec(weights + i, f"input{i}", a) for i, a in enumerate(in_avals[weights:])
            ),
            outputs=tuple(spec(i, f"output{i}", a) for i, a in enumerate(out_avals)),
        )

    def check_named(self, arrays: Mapping[str, npt.ArrayLike]) -> dict[str, Array]:
        """Check one task's inputs named by flat index (as an inputs file holds them).

        Every input of the program must be there and nothing else; then as ``bind_inputs``.
        """
        expected = [spec.key for spec in self.inputs]
        missing = [k for k in expected if k not in arrays]
        if missing:
            wanted = ", ".join(s.describe() for s in self.inputs if s.key in missing)
            raise ProgramInputsError(
                f"missing inputs {missing} ({wanted}); the program takes inputs {expected}"
            )
        extra = sorted(set(arrays) - set(expected), key=_index_order)
        if extra:
            raise ProgramInputsError(
                f"tensors {extra} are not inputs of the program (it takes {expected})"
            )
        return self.bind_inputs([arrays[k] for k in expected])

    @property
    def symbolic_dims(self) -> tuple[str, ...]:
        """Return the names of the symbolic dimensions, in order of first appearance."""
        names: list[str] = []
        for spec in self.inputs:
            for d in spec.shape:
                if isinstance(d, str) and d not in names:
                    names.append(d)
        return tuple(names)

    def bind_inputs(self, arrays: Sequence[npt.ArrayLike]) -> dict[str, Array]:
        """Check ``arrays`` (one per input, in order) and return them named by flat index.

        Raise :class:`ProgramInputsError` on a wrong count, rank, size or dtype, or when one
        symbolic dimension would take two sizes. Values are converted with ``np.asarray``
        but never cast: a float64 array for a float32 input is an error, not a silent copy.
        """
        if len(arrays) != len(self.inputs):
            raise ProgramInputsError(
                f"expected {len(self.inputs)} inputs "
                f"({', '.join(s.describe() for s in self.inputs)}), got {len(arrays)}"
            )
        bound: dict[str, int] = {}
        named: dict[str, Array] = {}
        for spec, value in zip(self.inputs, arrays, strict=True):
            array = np.asarray(value)
            if str(array.dtype) != spec.dtype:
                raise ProgramInputsError(
                    f"input {spec.describe()} got dtype {array.dtype}, expected {spec.dtype}"
                )
            if array.ndim != len(spec.shape):
                raise ProgramInputsError(
                    f"input {spec.describe()} got rank {array.ndim} shape {array.shape}"
                )
            for axis, (want, got) in enumerate(zip(spec.shape, array.shape, strict=True)):
                if isinstance(want, int):
                    if want != got:
                        raise ProgramInputsError(
                            f"input {spec.describe()} got shape {array.shape}: axis {axis} "
                            f"must be {want}"
                        )
                elif bound.setdefault(want, got) != got:
                    raise ProgramInputsError(
                        f"input {spec.describe()} got shape {array.shape}: dimension {want!r} "
                        f"is {bound[want]} in an earlier input"
                    )
                elif got < 1:
                    raise ProgramInputsError(f"dimension {want!r} must be at least 1, got {got}")
            named[spec.key] = np.ascontiguousarray(array).reshape(array.shape)  # keeps 0-d
        return named

    def unpack_outputs(self, arrays: Mapping[str, Array]) -> list[Array]:
        """Return delivered outputs in flat order, checking names, ranks and dtypes."""
        expected = {spec.key for spec in self.outputs}
        if set(arrays) != expected:
            raise ProgramOutputsError(
                f"outputs named {sorted(arrays, key=_index_order)}, expected "
                f"{sorted(expected, key=_index_order)}"
            )
        result = []
        for spec in self.outputs:
            array = arrays[spec.key]
            if spec.shape == () and array.shape == (1,):
                # programs.envelope.encode_arrays stores a 0-d array as shape (1,)
                # (np.ascontiguousarray returns ndim >= 1): read it back as the scalar it is.
                array = array.reshape(())
            if str(array.dtype) != spec.dtype or array.ndim != len(spec.shape):
                raise ProgramOutputsError(
                    f"output {spec.describe()} came back as {array.shape}:{array.dtype}"
                )
            for want, got in zip(spec.shape, array.shape, strict=True):
                if isinstance(want, int) and want != got:
                    raise ProgramOutputsError(
                        f"output {spec.describe()} came back with shape {array.shape}"
                    )
            result.append(array)
        return result


def _index_order(name: str) -> tuple[int, str]:
    return (int(name), "") if name.isdigit() else (1 << 62, name)
