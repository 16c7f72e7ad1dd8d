"""An exported model: program bytes, weights section, signature; builds task envelopes.

Pure (numpy, safetensors and ``contracts`` only): a client that only submits tasks for a
model exported elsewhere does not need JAX.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy.typing as npt

from client.errors import ProgramOutputsError
from client.models.signature import Array, ProgramSignature
from programs.envelope import (
    ArrayFormat,
    ProducerVersions,
    ProgramEnvelope,
    ProgramFormatError,
    decode_arrays,
    encode_arrays,
)


@dataclass(frozen=True, slots=True)
class ExportedModel:
    """A serialized ``jax.export.Exported`` with its weights and example inputs.

    ``weights`` is the safetensors file of the weights section (encoded once, so every task
    of the model carries byte-identical weights); ``example_inputs`` are the arrays the model
    was exported with, kept to build compile envelopes and reference runs.
    """

    program: bytes
    weights: bytes | None
    signature: ProgramSignature
    producer: ProducerVersions
    platforms: tuple[str, ...]
    example_inputs: tuple[Array, ...]

    def envelope(self, *inputs: npt.ArrayLike) -> ProgramEnvelope:
        """Return an inference envelope for ``inputs`` (one array per program input)."""
        return ProgramEnvelope.create(
            program=self.program,
            inputs=encode_inputs(self.signature, inputs),
            producer=self.producer,
            platforms=self.platforms,
            weights=self.weights,
        )

    def example_envelope(self) -> ProgramEnvelope:
        """Return an inference envelope for the example inputs the model was exported with."""
        return self.envelope(*self.example_inputs)

    def compile_envelope(self) -> ProgramEnvelope:
        """Return the smallest envelope a provider can compile.

        With concrete shapes only the program travels (a compile needs shapes, not values,
        so weights are not uploaded for a compile check); with symbolic dimensions the
        example inputs and the weights go along to fix the shapes.
        """
        if all(spec.is_concrete for spec in self.signature.inputs):
            return ProgramEnvelope.create(
                program=self.program,
                inputs=b"",
                producer=self.producer,
                platforms=self.platforms,
            )
        return self.example_envelope()

    def decode_outputs(self, data: bytes) -> list[Array]:
        """Return a delivery's outputs (safetensors bytes) in flat order, checked."""
        return decode_outputs(self.signature, data)


def encode_inputs(signature: ProgramSignature, inputs: Sequence[npt.ArrayLike]) -> bytes:
    """Check ``inputs`` against ``signature`` and return them as safetensors, index-named."""
    named = signature.bind_inputs(inputs)
    return encode_arrays(named) if named else b""


def decode_outputs(
    signature: ProgramSignature, data: bytes, fmt: ArrayFormat = ArrayFormat.SAFETENSORS
) -> list[Array]:
    """Decode delivered outputs and return them in flat order; raise on any mismatch."""
    try:
        arrays = decode_arrays(data, fmt)
    except ProgramFormatError as exc:
        raise ProgramOutputsError(f"cannot decode outputs: {exc}") from exc
    return signature.unpack_outputs(arrays)
