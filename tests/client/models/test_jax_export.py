"""Exporting JAX functions into task programs, and running them in the provider's sandbox."""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from client.errors import ModelExportError, ProgramInputsError, ProgramOutputsError
from client.models import ExportedModel, export_jax, run_local
from programs.envelope import ArrayFormat, decode_arrays, encode_arrays, inputs_hash
from provider.sandbox import CompileResult, Sandbox
from tests.client.models.helpers import run_in_sandbox

Params = dict[str, Any]


def mlp(p: Params, x: Any) -> Any:
    """Two dense layers with a GELU."""
    return jax.nn.gelu(x @ p["hidden"]["w"] + p["hidden"]["b"]) @ p["out"]["w"] + p["out"]["b"]


def mlp_params(rng: np.random.Generator, d_in: int = 32, d_h: int = 64, d_out: int = 10) -> Params:
    """Random MLP weights, nested so the pytree order is not the insertion order."""
    return {
        "out": {
            "w": rng.standard_normal((d_h, d_out), dtype=np.float32) / math.sqrt(d_h),
            "b": rng.standard_normal((d_out,), dtype=np.float32) * 0.1,
        },
        "hidden": {
            "w": rng.standard_normal((d_in, d_h), dtype=np.float32) / math.sqrt(d_in),
            "b": rng.standard_normal((d_h,), dtype=np.float32) * 0.1,
        },
    }


def batch(rng: np.random.Generator, n: int, d: int = 32) -> np.ndarray[Any, Any]:
    """Random float32 rows."""
    return rng.standard_normal((n, d), dtype=np.float32)


@pytest.fixture
def params(rng: np.random.Generator) -> Params:
    """MLP weights."""
    return mlp_params(rng)


@pytest.fixture
def symbolic(params: Params, rng: np.random.Generator) -> ExportedModel:
    """The MLP exported with a symbolic batch dimension."""
    return export_jax(mlp, weights=params, example_inputs=[batch(rng, 4)], batch_dim="batch")


def test_export_round_trip_through_sandbox_matches_direct_call(
    sandbox: Sandbox, params: Params, rng: np.random.Generator
) -> None:
    x = batch(rng, 8)
    model = export_jax(mlp, weights=params, example_inputs=[x])

    (out,) = run_in_sandbox(sandbox, model, model.example_envelope())

    np.testing.assert_allclose(out, np.asarray(jax.jit(mlp)(params, x)), rtol=0, atol=1e-6)
    assert model.platforms == ("cpu", "tpu")


def test_weights_travel_in_their_own_section_named_by_flat_index(
    symbolic: ExportedModel, params: Params, rng: np.random.Generator
) -> None:
    envelope = symbolic.envelope(batch(rng, 3))
    assert envelope.weights is not None
    weights = decode_arrays(envelope.weights, ArrayFormat.SAFETENSORS)
    inputs = decode_arrays(envelope.inputs, ArrayFormat.SAFETENSORS)

    assert sorted(weights) == ["0", "1", "2", "3"] and sorted(inputs) == ["4"]
    labels = [spec.label for spec in symbolic.signature.weights]
    assert labels == ["['hidden']['b']", "['hidden']['w']", "['out']['b']", "['out']['w']"]
    np.testing.assert_array_equal(weights["1"], params["hidden"]["w"])
    assert envelope.inputs_sha256 == inputs_hash(envelope.inputs, envelope.weights)
    assert symbolic.envelope(batch(rng, 5)).weights == envelope.weights  # encoded once


def test_symbolic_batch_runs_at_two_batch_sizes_with_one_program(
    sandbox: Sandbox, symbolic: ExportedModel, params: Params, rng: np.random.Generator
) -> None:
    assert symbolic.signature.inputs[0].shape == ("batch", 32)
    assert symbolic.signature.outputs[0].shape == ("batch", 10)
    for n in (3, 17):
        x = batch(rng, n)
        envelope = symbolic.envelope(x)
        (out,) = run_in_sandbox(sandbox, symbolic, envelope)
        assert out.shape == (n, 10)
        np.testing.assert_allclose(out, np.asarray(mlp(params, x)), rtol=0, atol=1e-6)
        assert envelope.program_sha256 == symbolic.example_envelope().program_sha256


def test_compile_envelope_of_concrete_program_carries_no_arrays_and_compiles(
    sandbox: Sandbox, params: Params, rng: np.random.Generator
) -> None:
    model = export_jax(mlp, weights=params, example_inputs=[batch(rng, 8)])
    envelope = model.compile_envelope()
    assert envelope.inputs == b"" and envelope.weights is None

    result = sandbox.compile(envelope, "local")

    assert isinstance(result, CompileResult), result
    assert result.memory is not None and result.memory.argument_bytes > 0


def test_compile_envelope_of_symbolic_program_fixes_shapes_with_examples(
    symbolic: ExportedModel,
) -> None:
    envelope = symbolic.compile_envelope()
    assert envelope.weights == symbolic.weights and envelope.inputs != b""


def test_function_without_weights_exports_inputs_only(
    sandbox: Sandbox, rng: np.random.Generator
) -> None:
    a, b = batch(rng, 4), batch(rng, 4)
    model = export_jax(lambda x, y: (x * y, jnp.tanh(x - y)), example_inputs=[a, b])
    assert model.weights is None and model.signature.weights == ()

    prod, diff = run_in_sandbox(sandbox, model, model.example_envelope())

    np.testing.assert_allclose(prod, a * b, atol=1e-6)
    np.testing.assert_allclose(diff, np.tanh(a - b), atol=1e-6)


def test_run_local_spot_check_matches_sandbox(
    sandbox: Sandbox, symbolic: ExportedModel, rng: np.random.Generator
) -> None:
    envelope = symbolic.envelope(batch(rng, 6))
    (remote,) = run_in_sandbox(sandbox, symbolic, envelope)
    (local,) = run_local(envelope)
    np.testing.assert_allclose(local, remote, rtol=0, atol=1e-6)


def test_64_bit_examples_are_shipped_in_the_programs_dtypes(rng: np.random.Generator) -> None:
    weights = {"scale": np.float64(2.0) * np.ones(3), "steps": np.arange(3, dtype=np.int64)}
    model = export_jax(
        lambda p, x: x * p["scale"] + p["steps"], weights=weights, example_inputs=[np.ones(3)]
    )
    assert model.weights is not None
    shipped = decode_arrays(model.weights, ArrayFormat.SAFETENSORS)
    assert [str(shipped[k].dtype) for k in ("0", "1")] == ["float32", "int32"]
    assert model.example_inputs[0].dtype == np.float32


@pytest.mark.parametrize(
    ("inputs", "message"),
    [
        ([], "expected 1 inputs"),
        ([np.zeros((3, 32), np.float64)], "dtype float64"),
        ([np.zeros((3, 31), np.float32)], "axis 1 must be 32"),
        ([np.zeros((3, 32, 1), np.float32)], "rank 3"),
        ([np.zeros((0, 32), np.float32)], "at least 1"),
    ],
)
def test_inputs_that_do_not_fit_the_signature_are_rejected_before_sending(
    symbolic: ExportedModel, inputs: list[np.ndarray[Any, Any]], message: str
) -> None:
    with pytest.raises(ProgramInputsError, match=message):
        symbolic.envelope(*inputs)


def test_one_symbolic_dimension_takes_one_size_across_inputs(rng: np.random.Generator) -> None:
    model = export_jax(
        lambda x, y: x + y, example_inputs=[batch(rng, 2), batch(rng, 2)], batch_dim="n"
    )
    model.envelope(batch(rng, 5), batch(rng, 5))
    with pytest.raises(ProgramInputsError, match="dimension 'n' is 5"):
        model.envelope(batch(rng, 5), batch(rng, 4))


def test_outputs_with_wrong_names_or_shapes_are_rejected(
    symbolic: ExportedModel, rng: np.random.Generator
) -> None:
    good = np.zeros((3, 10), np.float32)
    assert symbolic.decode_outputs(encode_arrays({"0": good}))[0].shape == (3, 10)
    with pytest.raises(ProgramOutputsError, match="expected"):
        symbolic.decode_outputs(encode_arrays({"1": good}))
    with pytest.raises(ProgramOutputsError, match="shape"):
        symbolic.decode_outputs(encode_arrays({"0": np.zeros((3, 9), np.float32)}))
    with pytest.raises(ProgramOutputsError, match="cannot decode"):
        symbolic.decode_outputs(b"not safetensors")


def test_function_that_cannot_be_traced_is_a_model_export_error(
    rng: np.random.Generator,
) -> None:
    def data_dependent(x: jax.Array) -> jax.Array:
        return x if float(x.sum()) > 0 else -x

    with pytest.raises(ModelExportError, match="data_dependent"):
        export_jax(data_dependent, example_inputs=[batch(rng, 2)])


def test_batch_axes_must_agree_on_the_example_batch(rng: np.random.Generator) -> None:
    with pytest.raises(ModelExportError, match="disagree"):
        export_jax(
            lambda x, y: x.sum() + y.sum(),
            example_inputs=[batch(rng, 2), batch(rng, 3)],
            batch_dim="b",
        )
