"""Ahead-of-time TPU v5e compiles on this CPU host through libtpu's real compiler."""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
import numpy as np
import pytest

from provider.capacity import tpu_compiler_available
from provider.diagnosis import Category, Stage
from provider.sandbox import Sandbox
from tests.provider.helpers import compiled, failed
from tests.provider.programs import (
    envelope_for,
    export_fn,
    mlp,
    mlp_params,
    pallas_blob,
    spec,
    transformer_block,
    transformer_params,
)

pytestmark = pytest.mark.skipif(not tpu_compiler_available(), reason="libtpu not installed")
GIB = 1 << 30


def test_transformer_block_compiles_for_v5e_and_fits(
    sandbox: Sandbox, rng: np.random.Generator
) -> None:
    params = transformer_params(rng, d=128)
    exported = export_fn(
        transformer_block,
        *(spec(*p.shape) for p in params),
        spec(8, 128, 128),
        platforms=("tpu",),
    )
    result = compiled(sandbox.compile(envelope_for(exported), "v5e:1x1"))

    assert (result.platform, result.device_kind, result.target) == ("tpu", "TPU v5 lite", "v5e:1x1")
    assert result.memory is not None and 0 < result.memory.total_bytes < GIB
    assert result.cost is not None and result.cost.flops > 0
    assert result.available_bytes is not None and 15 * GIB < result.available_bytes <= 16 * GIB
    assert not result.cache_hit

    again = compiled(sandbox.compile(envelope_for(exported), "v5e:1x1"))
    assert again.cache_hit
    assert again.memory == result.memory


def test_multi_platform_export_compiles_for_tpu_and_cpu(
    sandbox: Sandbox, rng: np.random.Generator
) -> None:
    params = mlp_params(rng)
    exported = export_fn(
        mlp, *(spec(*p.shape) for p in params), spec(8, 32), platforms=("cpu", "tpu")
    )
    assert compiled(sandbox.compile(envelope_for(exported), "v5e:1x1")).platform == "tpu"
    assert compiled(sandbox.compile(envelope_for(exported), "local")).platform == "cpu"


def test_model_over_v5e_hbm_reported_by_compiler_is_oom_with_bytes(sandbox: Sandbox) -> None:
    exported = export_fn(lambda w: w * 2, spec(60000, 60000), platforms=("tpu",))
    failure = failed(sandbox.compile(envelope_for(exported), "v5e:1x1"), Category.OOM)
    diagnosis = failure.diagnosis
    assert diagnosis.required_bytes is not None and diagnosis.available_bytes is not None
    assert diagnosis.required_bytes > diagnosis.available_bytes
    assert diagnosis.available_bytes == int(15.75 * GIB)
    assert diagnosis.stage is Stage.COMPILE


def test_weights_over_v5e_hbm_caught_by_memory_analysis_is_oom_with_bytes(
    sandbox: Sandbox,
) -> None:
    # 68000^2 float32 = 18.5 GB (17.2 GiB) of weights: XLA compiles it, memory_analysis says no.
    exported = export_fn(
        lambda w, x: jnp.tanh(x @ w).sum(),
        spec(68000, 68000),
        spec(8, 68000),
        platforms=("tpu",),
    )
    failure = failed(sandbox.compile(envelope_for(exported), "v5e:1x1"), Category.OOM)
    diagnosis = failure.diagnosis
    assert diagnosis.required_bytes is not None and diagnosis.required_bytes >= 68000**2 * 4
    assert diagnosis.available_bytes is not None
    assert diagnosis.available_bytes < diagnosis.required_bytes
    assert any("precision" in hint for hint in diagnosis.hints)


def test_pallas_kernel_for_tpu_is_rejected_before_compiling(sandbox: Sandbox) -> None:
    failure = failed(
        sandbox.compile(envelope_for(pallas_blob()), "v5e:1x1"), Category.UNSUPPORTED_OP
    )
    assert failure.diagnosis.op == "tpu_custom_call"
    assert failure.diagnosis.stage is Stage.VALIDATE


def test_cpu_only_export_on_tpu_target_is_platform_mismatch(sandbox: Sandbox) -> None:
    exported = export_fn(lambda x: x * 2, spec(4))
    failed(sandbox.compile(envelope_for(exported), "v5e:1x1"), Category.PLATFORM_MISMATCH)


def test_program_for_8_devices_on_2x2_is_device_count_mismatch(sandbox: Sandbox) -> None:
    exported = export_fn(lambda x: x * 2, spec(4), platforms=("tpu",))
    eight = dataclasses.replace(exported, nr_devices=8)
    failure = failed(
        sandbox.compile(envelope_for(eight), "v5e:2x2"), Category.DEVICE_COUNT_MISMATCH
    )
    assert "8 devices" in failure.diagnosis.message


def test_unknown_target_is_reported_not_raised(sandbox: Sandbox) -> None:
    exported = export_fn(lambda x: x * 2, spec(4), platforms=("tpu",))
    failure = failed(sandbox.compile(envelope_for(exported), "v99:1x1"), Category.PLATFORM_MISMATCH)
    assert "unknown compile target" in failure.diagnosis.message
