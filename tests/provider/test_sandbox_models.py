"""Real exported models run in spawned workers; outputs match a direct JAX reference."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from programs.envelope import encode_envelope, inputs_hash, outputs_hash, program_hash
from provider.diagnosis import Category, Stage
from provider.sandbox import Sandbox, SandboxLimits
from tests.provider.helpers import compiled, failed, outputs, ran
from tests.provider.programs import (
    envelope_for,
    export_fn,
    mlp,
    mlp_params,
    spec,
    transformer_block,
    transformer_params,
    with_module_text,
)


def test_mlp_with_weights_section_matches_reference(
    sandbox: Sandbox, rng: np.random.Generator
) -> None:
    params = mlp_params(rng)
    x = rng.standard_normal((8, 32), dtype=np.float32)
    exported = export_fn(mlp, *(spec(*p.shape) for p in params), spec(8, 32))
    envelope = envelope_for(exported, [*params, x], weights=dict(enumerate(params)))

    result = ran(sandbox.run(envelope))

    np.testing.assert_allclose(outputs(result)[0], mlp(*params, x), rtol=1e-5, atol=1e-5)
    assert result.program_sha256 == program_hash(envelope.program)
    assert result.inputs_sha256 == inputs_hash(envelope.inputs, envelope.weights)
    assert result.outputs_sha256 == outputs_hash(result.outputs)
    assert result.platform == "cpu"
    assert result.device_time_s > 0


def test_transformer_block_matches_reference(sandbox: Sandbox, rng: np.random.Generator) -> None:
    params = transformer_params(rng)
    x = rng.standard_normal((2, 16, 32), dtype=np.float32)
    exported = export_fn(transformer_block, *(spec(*p.shape) for p in params), spec(2, 16, 32))

    result = ran(sandbox.run(encode_envelope(envelope_for(exported, [*params, x]))))

    expected = jax.jit(transformer_block)(*params, x)
    np.testing.assert_allclose(outputs(result)[0], expected, rtol=1e-4, atol=1e-4)


def test_symbolic_batch_model_runs_each_batch_size(
    sandbox: Sandbox, rng: np.random.Generator
) -> None:
    params = mlp_params(rng)
    exported = export_fn(mlp, *(spec(*p.shape) for p in params), spec("b", 32))
    assert "b" in str(exported.in_avals[-1])
    for batch in (3, 5, 3):
        x = rng.standard_normal((batch, 32), dtype=np.float32)
        result = ran(sandbox.run(envelope_for(exported, [*params, x])))
        np.testing.assert_allclose(outputs(result)[0], mlp(*params, x), rtol=1e-5, atol=1e-5)
    assert result.cache_hit  # batch 3 again: the worker reuses its executable
    assert result.compile_time_s == 0.0


def test_pytree_outputs_come_back_in_flat_order(sandbox: Sandbox) -> None:
    exported = export_fn(lambda x: {"double": x * 2, "sum": x.sum()}, spec(3))
    x = np.arange(3, dtype=np.float32)
    result = ran(sandbox.run(envelope_for(exported, [x])))
    flat = jax.tree_util.tree_leaves({"double": x * 2, "sum": x.sum()})
    for got, want in zip(outputs(result), flat, strict=True):
        np.testing.assert_allclose(got, want)


def test_compile_local_reports_memory_and_cost(sandbox: Sandbox, rng: np.random.Generator) -> None:
    params = mlp_params(rng)
    exported = export_fn(mlp, *(spec(*p.shape) for p in params), spec(8, 32))

    result = compiled(sandbox.compile(envelope_for(exported), "local"))

    assert result.platform == "cpu"
    assert result.memory is not None and result.memory.argument_bytes == 4 * (
        sum(p.size for p in params) + 8 * 32
    )
    assert result.cost is not None and result.cost.flops >= 2 * 8 * 32 * 64
    assert result.available_bytes is not None and result.available_bytes > 0


def test_compile_symbolic_without_inputs_is_bad_arguments(sandbox: Sandbox) -> None:
    exported = export_fn(lambda x: x * 2, spec("b", 4))
    failure = failed(sandbox.compile(envelope_for(exported)), Category.BAD_ARGUMENTS)
    assert "concrete shapes" in failure.diagnosis.message


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ([np.ones((4, 16), np.int32)], "Dtype mismatch"),
        ([np.ones((5, 16), np.float32)], "Shape mismatch"),
        ([], "missing tensors"),
    ],
)
def test_wrong_arguments_are_bad_arguments(
    sandbox: Sandbox, args: list[np.ndarray], message: str
) -> None:
    exported = export_fn(lambda x: x.sum(0), spec(4, 16))
    failure = failed(sandbox.run(envelope_for(exported, args)), Category.BAD_ARGUMENTS)
    assert message in failure.diagnosis.message


def test_program_over_worker_memory_is_oom_before_running(sandbox: Sandbox) -> None:
    exported = export_fn(lambda x: jnp.zeros((5 << 30,), jnp.float32) + x, spec(1))
    failure = failed(sandbox.run(envelope_for(exported, [np.ones((1,), np.float32)])), Category.OOM)
    assert failure.diagnosis.required_bytes is not None
    assert failure.diagnosis.required_bytes >= 20 << 30
    assert failure.diagnosis.available_bytes is not None
    assert failure.diagnosis.available_bytes < failure.diagnosis.required_bytes
    assert failure.diagnosis.stage is Stage.COMPILE


def test_newer_producer_jax_is_version_mismatch_before_compiling(sandbox: Sandbox) -> None:
    exported = export_fn(lambda x: x * 2, spec(4))
    envelope = envelope_for(exported, [np.ones(4, np.float32)], producer_jax="99.0.0")
    failure = failed(sandbox.run(envelope), Category.VERSION_MISMATCH)
    assert failure.diagnosis.stage is Stage.PARSE


def test_calling_convention_out_of_range_is_version_mismatch(sandbox: Sandbox) -> None:
    exported = export_fn(lambda x: x * 2, spec(4))
    future = dataclasses.replace(exported, calling_convention_version=99)
    envelope = envelope_for(future, [np.ones(4, np.float32)])
    failure = failed(sandbox.run(envelope), Category.VERSION_MISMATCH)
    assert "calling convention version 99" in failure.diagnosis.message


def test_stablehlo_artifact_too_new_is_version_mismatch(sandbox: Sandbox) -> None:
    exported = export_fn(lambda x: x * 2, spec(4))
    module = exported.mlir_module_serialized.replace(b"StableHLO_v1.15.0", b"StableHLO_v9.99.0")
    future = dataclasses.replace(exported, mlir_module_serialized=module)
    envelope = envelope_for(future, [np.ones(4, np.float32)])
    failure = failed(sandbox.run(envelope), Category.VERSION_MISMATCH)
    assert "StableHLO version 9.99.0" in failure.diagnosis.message


def test_hand_written_module_runs(sandbox: Sandbox) -> None:
    base = export_fn(lambda x: x * 2, spec(4))
    text = """
    module @m attributes {mhlo.num_partitions = 1 : i32, mhlo.num_replicas = 1 : i32} {
      func.func public @main(%arg0: tensor<4xf32>) -> (tensor<4xf32>) {
        %0 = stablehlo.add %arg0, %arg0 : tensor<4xf32>
        %1 = stablehlo.multiply %0, %arg0 : tensor<4xf32>
        return %1 : tensor<4xf32>
      }
    }
    """
    x = np.arange(4, dtype=np.float32)
    result = ran(sandbox.run(envelope_for(base, [x], program=with_module_text(base, text))))
    np.testing.assert_allclose(outputs(result)[0], 2 * x * x)


def test_compile_in_new_worker_hits_per_kind_persistent_cache(
    tmp_path: Path, rng: np.random.Generator
) -> None:
    params = transformer_params(rng, d=64)
    exported = export_fn(transformer_block, *(spec(*p.shape) for p in params), spec(4, 64, 64))
    envelope = envelope_for(exported)
    times = []
    for expect_hit in (False, True):
        with Sandbox(1, SandboxLimits(), tmp_path, jax_platforms="cpu") as box:
            result = compiled(box.compile(envelope))
            assert result.cache_hit is expect_hit
            times.append(result.compile_time_s)
    assert any((tmp_path / "clients").rglob("*/xla/*/*"))  # the daemon's store, per client
    print(
        f"\ncompile cold {times[0] * 1e3:.1f} ms, warm from cache in a new worker "
        f"{times[1] * 1e3:.1f} ms"
    )
