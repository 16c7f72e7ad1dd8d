"""Each failure a client can cause is answered with the right category and the real reason.

Real programs through real sandbox workers (JAX on CPU, libtpu for the v5e compiles).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from programs.envelope import ArrayFormat, ProgramEnvelope, encode_arrays
from provider.capacity import tpu_compiler_available
from provider.diagnosis import (
    F64_ON_TPU_HINTS,
    OP_COUNT_HINTS,
    OUTPUT_DTYPE_HINTS,
    Category,
    Stage,
    classify,
)
from provider.sandbox import Sandbox, SandboxLimits
from tests.provider.helpers import compiled, failed, outputs, ran
from tests.provider.programs import envelope_for, export_fn, op_bomb, spec

needs_libtpu = pytest.mark.skipif(not tpu_compiler_available(), reason="libtpu not installed")


@pytest.fixture(scope="module")
def box(cache_dir: Path) -> Iterator[Sandbox]:
    """One worker, no spares: every case runs in the same worker unless it retires it."""
    with Sandbox(1, SandboxLimits(), cache_dir, jax_platforms="cpu", spares=0) as sandbox:
        yield sandbox


def _export_x64(fn: object, *specs: jax.ShapeDtypeStruct, platforms: tuple[str, ...]) -> object:
    with jax.enable_x64(True):
        return export_fn(fn, *specs, platforms=platforms)  # type: ignore[arg-type]


def _f64_program() -> jax.export.Exported:
    exported = _export_x64(
        lambda x: jnp.sin(x) * 2, spec(4, dtype=jnp.float64), platforms=("tpu", "cpu")
    )
    assert isinstance(exported, jax.export.Exported)
    return exported


def _npz_envelope(exported: jax.export.Exported, x: np.ndarray) -> ProgramEnvelope:
    base = envelope_for(exported)
    return ProgramEnvelope.create(
        program=base.program,
        inputs=encode_arrays({"0": x}, ArrayFormat.NPZ),
        producer=base.producer,
        platforms=base.platforms,
        array_format=ArrayFormat.NPZ,
    )


def test_f64_program_runs_on_cpu_with_float64_inputs(box: Sandbox) -> None:
    x = np.linspace(0, 1, 4, dtype=np.float64)
    result = ran(box.run(envelope_for(_f64_program(), [x])))
    (y,) = outputs(result)
    assert y.dtype == np.float64
    np.testing.assert_allclose(y, np.sin(x) * 2, rtol=1e-15)


def test_f64_program_compiles_on_cpu_without_arguments(box: Sandbox) -> None:
    result = compiled(box.compile(envelope_for(_f64_program()), "local"))
    assert result.platform == "cpu"


@needs_libtpu
def test_f64_program_for_v5e_is_an_unsupported_dtype_with_a_cast_hint(box: Sandbox) -> None:
    failure = failed(box.compile(envelope_for(_f64_program()), "v5e:1x1"), Category.UNSUPPORTED_OP)
    message = failure.diagnosis.message
    assert "float64" in message and "v5e:1x1" in message, message
    assert "called with float32" not in message
    assert failure.diagnosis.op == "float64"
    assert failure.diagnosis.hints == F64_ON_TPU_HINTS


def test_c128_program_is_refused_before_running_with_the_reason(box: Sandbox) -> None:
    exported = _export_x64(lambda x: x * 2, spec(4, dtype=jnp.complex128), platforms=("cpu",))
    assert isinstance(exported, jax.export.Exported)
    envelope = _npz_envelope(exported, np.ones(4, np.complex128))
    failure = failed(box.run(envelope), Category.UNSUPPORTED_OP)
    assert "complex128" in failure.diagnosis.message
    assert failure.diagnosis.stage is Stage.VALIDATE
    assert failure.diagnosis.hints == OUTPUT_DTYPE_HINTS


@pytest.mark.parametrize("platform", ["tpu", "gpu"])
def test_platform_target_on_a_cpu_host_is_refused_before_any_worker(
    box: Sandbox, platform: str
) -> None:
    exported = export_fn(lambda x: x * 2, spec(4))
    assert box.target_refusal(platform) is not None
    failure = failed(box.compile(envelope_for(exported), platform), Category.PLATFORM_MISMATCH)
    assert f"'{platform}'" in failure.diagnosis.message and "cpu" in failure.diagnosis.message
    assert failure.diagnosis.stage is Stage.PARSE
    assert box.target_refusal("cpu") is None and box.target_refusal("local") is None


def test_absurd_topology_is_refused_in_the_parent_with_its_size(box: Sandbox) -> None:
    exported = export_fn(lambda x: x * 2, spec(4))
    started = time.perf_counter()
    failure = failed(box.compile(envelope_for(exported), "v4:64x64x64"), Category.PLATFORM_MISMATCH)
    elapsed = time.perf_counter() - started
    assert "262144 chips" in failure.diagnosis.message and "4096" in failure.diagnosis.message
    assert failure.elapsed_s == 0.0  # answered by the parent: no worker, no compiler
    print(f"\nv4:64x64x64 refused in {elapsed * 1e3:.2f} ms")


@pytest.mark.parametrize(
    ("dtype", "sent"), [(np.float64, "float64"), (np.float16, "float16"), (np.int32, "int32")]
)
def test_input_of_another_dtype_is_refused_never_cast(box: Sandbox, dtype: type, sent: str) -> None:
    exported = export_fn(lambda x: x * 2, spec(4))
    failure = failed(box.run(envelope_for(exported, [np.ones(4, dtype)])), Category.BAD_ARGUMENTS)
    assert f"takes float32 and was sent {sent}" in failure.diagnosis.message


def test_op_cap_states_the_real_count_and_program_size_hints(box: Sandbox) -> None:
    exported = export_fn(op_bomb, spec(4))
    failure = failed(
        box.run(envelope_for(exported, [np.ones(4, np.float32)])), Category.UNSUPPORTED_OP
    )
    message = failure.diagnosis.message
    count = int(message.split("op count ")[1].split(" ")[0])
    assert count > 20_000, message  # the module's real size, not the cap + 1
    assert "cap of 8000" in message
    assert failure.diagnosis.hints == OP_COUNT_HINTS
    assert not any("custom call" in hint for hint in failure.diagnosis.hints)


def test_unregistered_operation_reaches_the_client_by_name(box: Sandbox) -> None:
    exported = export_fn(lambda x: x * 2, spec(4))
    module = exported.mlir_module_serialized.replace(b"multiply", b"multiplx")
    renamed = dataclasses.replace(exported, mlir_module_serialized=module)
    envelope = envelope_for(exported, [np.ones(4, np.float32)], program=bytes(renamed.serialize()))
    failure = failed(box.run(envelope), Category.MALFORMED_INPUT)
    message = failure.diagnosis.message
    assert "unregistered operation 'vhlo.multiplx_v1'" in message, message
    assert message != "failed to deserialize module"


def test_version_refused_cold_is_refused_warm(box: Sandbox) -> None:
    exported = export_fn(lambda x: x + 1, spec(4))
    x = np.ones(4, np.float32)
    ran(box.run(envelope_for(exported, [x])))  # the worker now holds this program warm
    newer = envelope_for(exported, [x], producer_jax="99.0.0")
    failure = failed(box.run(newer), Category.VERSION_MISMATCH)
    assert "99.0.0" in failure.diagnosis.message
    failed(box.run(newer), Category.VERSION_MISMATCH)
    ran(box.run(envelope_for(exported, [x])))


def test_output_over_the_cap_is_oom_with_required_bytes(box: Sandbox) -> None:
    exported = export_fn(lambda x: jnp.zeros((150_000_000,), jnp.float32) + x[0], spec(4))
    failure = failed(box.run(envelope_for(exported, [np.ones(4, np.float32)])), Category.OOM)
    assert failure.diagnosis.required_bytes == 600_000_000
    assert failure.diagnosis.available_bytes == SandboxLimits().max_output_bytes
    assert "600000000 bytes" in failure.diagnosis.message


def test_error_raised_while_executing_is_its_own_category_not_a_crash() -> None:
    # A runtime error the worker caught and survived (the parent reports deaths as crashes).
    text = "jax.errors.JaxRuntimeError: INTERNAL: Buffer has been deleted or donated."
    diagnosis = classify(text, Stage.EXECUTE)
    assert diagnosis.category is Category.EXECUTE_ERROR
    assert diagnosis.code == 11
    assert diagnosis.message == "INTERNAL: Buffer has been deleted or donated."
