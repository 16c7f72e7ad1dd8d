"""Deep programs, compiler crashes and verifier refusals are told to the client as they are.

Real programs through real sandboxed workers (JAX on CPU): a valid program nested past the
cap is refused by name before it reaches the compiler, the hint of a crash follows what
killed the worker, and a module the MLIR verifier refuses names its op and the reason.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from programs.envelope import ProgramEnvelope
from provider.diagnosis import (
    COMPILER_CRASH_HINTS,
    HINTS,
    NESTING_HINTS,
    VERIFIER_HINTS,
    Category,
    Stage,
)
from provider.sandbox import Sandbox, SandboxLimits
from tests.provider.helpers import compiled, failed, outputs, ran
from tests.provider.programs import envelope_for, export_fn, spec, with_module_text

CAP = SandboxLimits().max_nesting


def nested_while_module(depth: int) -> str:
    """A valid module of ``depth`` while loops, each in the body of the one above."""
    opening: list[str] = []
    closing: list[str] = []
    value = "%arg0"
    for k in range(depth):
        opening += [
            f"%c{k} = stablehlo.constant dense<0> : tensor<i32>",
            f"%w{k}:2 = stablehlo.while(%i{k} = %c{k}, %v{k} = {value}) : "
            "tensor<i32>, tensor<4xf32>",
            " cond {",
            f"  %n{k} = stablehlo.constant dense<2> : tensor<i32>",
            f"  %p{k} = stablehlo.compare LT, %i{k}, %n{k} : "
            "(tensor<i32>, tensor<i32>) -> tensor<i1>",
            f"  stablehlo.return %p{k} : tensor<i1>",
            " } do {",
        ]
        value = f"%v{k}"
    innermost = f"%y = stablehlo.add {value}, {value} : tensor<4xf32>"
    result = "%y"
    for k in reversed(range(depth)):
        closing += [
            f"  %o{k} = stablehlo.constant dense<1> : tensor<i32>",
            f"  %s{k} = stablehlo.add %i{k}, %o{k} : tensor<i32>",
            f"  stablehlo.return %s{k}, {result} : tensor<i32>, tensor<4xf32>",
            " }",
        ]
        result = f"%w{k}#1"
    return "\n".join(
        [
            "module @jit_f attributes {mhlo.num_partitions = 1 : i32, "
            "mhlo.num_replicas = 1 : i32} {",
            "  func.func public @main(%arg0: tensor<4xf32>) -> (tensor<4xf32>) {",
            *opening,
            innermost,
            *closing,
            f"    return {result} : tensor<4xf32>",
            "  }",
            "}",
        ]
    )


def _deep_envelope(depth: int) -> ProgramEnvelope:
    base = export_fn(lambda x: x * 2, spec(4))
    blob = with_module_text(base, nested_while_module(depth))
    return envelope_for(base, [np.ones(4, np.float32)], program=blob)


@pytest.fixture(scope="module")
def box(cache_dir: Path) -> Iterator[Sandbox]:
    """One worker with the default limits, no spares."""
    with Sandbox(1, SandboxLimits(), cache_dir, jax_platforms="cpu", spares=0) as sandbox:
        yield sandbox


def test_program_nested_within_the_cap_runs(box: Sandbox) -> None:
    (y,) = outputs(ran(box.run(_deep_envelope(3))))
    # Two trips per level: the innermost body doubles 2**3 times.
    np.testing.assert_allclose(y, np.full(4, 2.0 ** (2**3), np.float32))


def test_program_nested_past_the_cap_is_refused_by_name_before_compiling(box: Sandbox) -> None:
    before = box.replacements
    failure = failed(box.run(_deep_envelope(CAP + 6)), Category.UNSUPPORTED_OP)
    diagnosis = failure.diagnosis
    assert diagnosis.category is not Category.MALFORMED_INPUT
    assert diagnosis.stage is Stage.VALIDATE, diagnosis
    assert diagnosis.op == "nesting depth"
    assert f"more than {CAP} levels deep" in diagnosis.message, diagnosis.message
    assert diagnosis.hints == NESTING_HINTS
    assert failure.compile_time_s == 0.0
    assert box.replacements == before  # refused, not crashed: no worker was lost


def test_compiler_crash_on_a_deep_program_gets_the_compiler_hint_not_custom_calls(
    cache_dir: Path,
) -> None:
    # With the cap lifted, the same kind of valid program overflows the compiler's stack.
    limits = SandboxLimits(max_nesting=10_000)
    with Sandbox(1, limits, cache_dir, jax_platforms="cpu", spares=0) as uncapped:
        failure = failed(uncapped.compile(_deep_envelope(300), "local"), Category.WORKER_CRASH)
        diagnosis = failure.diagnosis
        assert diagnosis.stage is Stage.COMPILE, diagnosis
        assert "signal 11 (SIGSEGV)" in diagnosis.message, diagnosis.message
        assert diagnosis.hints == COMPILER_CRASH_HINTS
        assert diagnosis.hints != HINTS[Category.WORKER_CRASH]
        assert not any("custom call" in hint for hint in diagnosis.hints)
        compiled(uncapped.compile(_deep_envelope(3), "local"))  # its replacement serves


def test_module_the_verifier_refuses_names_the_op_and_the_reason(box: Sandbox) -> None:
    # The Exported states 8 floats; its module takes 4: lowering the call fails to verify.
    exported = export_fn(lambda x: x * 2, spec(4))
    stated = dataclasses.replace(exported, in_avals=(jax.core.ShapedArray((8,), jnp.float32),))
    envelope = envelope_for(exported, [np.ones(8, np.float32)], program=bytes(stated.serialize()))
    diagnosis = failed(box.run(envelope), Category.UNSUPPORTED_OP).diagnosis
    assert diagnosis.op == "func.call", diagnosis
    assert "operand type mismatch" in diagnosis.message, diagnosis.message
    assert "verification" in diagnosis.message
    assert diagnosis.hints == VERIFIER_HINTS
    assert not any("custom call" in hint for hint in diagnosis.hints)
