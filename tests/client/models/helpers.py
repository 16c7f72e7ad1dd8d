"""Assertions shared by the model tests."""

from __future__ import annotations

from client.models.program import ExportedModel
from client.models.signature import Array
from programs.envelope import ProgramEnvelope
from provider.sandbox import InferenceResult, Sandbox


def run_in_sandbox(
    sandbox: Sandbox, model: ExportedModel, envelope: ProgramEnvelope
) -> list[Array]:
    """Run ``envelope`` in the sandbox and return the model's decoded outputs."""
    result = sandbox.run(envelope)
    assert isinstance(result, InferenceResult), result
    assert result.program_sha256 == envelope.program_sha256
    assert result.inputs_sha256 == envelope.inputs_sha256
    return model.decode_outputs(result.outputs)
