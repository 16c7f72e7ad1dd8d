"""Hostile blobs are rejected or classified; the pool never dies and the next task runs."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from programs.envelope import MAX_PROGRAM_BYTES, ProducerVersions, ProgramEnvelope
from provider.diagnosis import Category, Stage
from provider.errors import SandboxClosedError
from provider.sandbox import InferenceResult, Sandbox, SandboxLimits, TaskFailure
from tests.provider.helpers import failed, outputs, ran
from tests.provider.programs import (
    envelope_for,
    export_fn,
    host_callback_blob,
    long_loop,
    mlp,
    mlp_params,
    mutated_programs,
    op_bomb,
    outfeed_blob,
    pallas_blob,
    spec,
)

LIMITS = SandboxLimits(validate_timeout_s=20, compile_timeout_s=60, execute_timeout_s=3)


class KillOnExecute:
    """Stage observer that SIGKILLs the worker once it starts executing, when armed."""

    def __init__(self) -> None:
        self.armed = False
        self.killed: list[int] = []

    def __call__(self, pid: int, stage: Stage) -> None:
        if self.armed and stage is Stage.EXECUTE:
            self.armed = False
            self.killed.append(pid)
            os.kill(pid, signal.SIGKILL)


@pytest.fixture(scope="module")
def killer() -> KillOnExecute:
    return KillOnExecute()


@pytest.fixture(scope="module")
def sandbox(cache_dir: Path, killer: KillOnExecute) -> Iterator[Sandbox]:
    """One worker with a short execute timeout and a stage observer that can kill it."""
    with Sandbox(1, LIMITS, cache_dir, jax_platforms="cpu", on_stage=killer) as box:
        yield box


def run_on(
    sandbox: Sandbox, envelope: ProgramEnvelope, caller: str
) -> InferenceResult | TaskFailure:
    """Run from a thread (the pool's blocking path) or from an event loop (its pipe reader)."""
    if caller == "loop":
        return asyncio.run(sandbox.run_async(envelope))
    return sandbox.run(envelope)


def assert_still_serves(sandbox: Sandbox, caller: str = "thread") -> None:
    rng = np.random.default_rng(0)
    params = mlp_params(rng, 4, 8, 2)
    x = rng.standard_normal((2, 4), dtype=np.float32)
    exported = export_fn(mlp, *(spec(*p.shape) for p in params), spec(2, 4))
    for _ in range(2):  # the second run takes the warm path (inputs only)
        result = ran(
            run_on(sandbox, envelope_for(exported, [*params, x], weights={0: params[0]}), caller)
        )
        np.testing.assert_allclose(outputs(result)[0], mlp(*params, x), rtol=1e-5, atol=1e-5)


def test_host_callback_custom_call_is_rejected(sandbox: Sandbox) -> None:
    base, blob = host_callback_blob()
    envelope = envelope_for(base, [np.ones(4, np.float32)], program=blob)
    failure = failed(sandbox.run(envelope), Category.UNSUPPORTED_OP)
    assert failure.diagnosis.op is not None and "callback" in failure.diagnosis.op
    assert failure.diagnosis.stage is Stage.VALIDATE
    assert_still_serves(sandbox)


def test_outfeed_is_rejected_instead_of_hanging(sandbox: Sandbox) -> None:
    base, blob = outfeed_blob()
    failure = failed(
        sandbox.run(envelope_for(base, [np.ones(4, np.float32)], program=blob)),
        Category.UNSUPPORTED_OP,
    )
    assert failure.diagnosis.op == "stablehlo.outfeed"
    assert_still_serves(sandbox)


def test_pallas_tpu_custom_call_relabelled_for_cpu_is_rejected(sandbox: Sandbox) -> None:
    relabelled = dataclasses.replace(pallas_blob(), platforms=("cpu",))
    failure = failed(
        sandbox.run(envelope_for(relabelled, [np.ones((8, 128), np.float32)])),
        Category.UNSUPPORTED_OP,
    )
    assert failure.diagnosis.op == "tpu_custom_call"
    assert_still_serves(sandbox)


def test_blob_exported_for_tpu_only_run_on_cpu_is_platform_mismatch(sandbox: Sandbox) -> None:
    failure = failed(
        sandbox.run(envelope_for(pallas_blob(), [np.ones((8, 128), np.float32)])),
        Category.PLATFORM_MISMATCH,
    )
    assert "'('tpu',)'" in failure.diagnosis.message
    assert_still_serves(sandbox)


def test_random_bytes_as_program_are_malformed(sandbox: Sandbox) -> None:
    envelope = ProgramEnvelope.create(
        program=np.random.default_rng(5).bytes(4096),
        inputs=b"",
        producer=ProducerVersions("0.10.2", "0.10.2", 10),
        platforms=("cpu",),
    )
    failed(sandbox.run(envelope), Category.MALFORMED_INPUT)
    assert_still_serves(sandbox)


def test_random_bytes_as_envelope_are_malformed(sandbox: Sandbox) -> None:
    failed(sandbox.run(np.random.default_rng(6).bytes(4096)), Category.MALFORMED_INPUT)
    failed(sandbox.compile(b"", "local"), Category.MALFORMED_INPUT)


def test_oversized_envelope_is_refused_in_the_parent(sandbox: Sandbox) -> None:
    failure = failed(
        sandbox.run(b"\x00" * (LIMITS.max_envelope_bytes + 1)), Category.MALFORMED_INPUT
    )
    assert "exceeds the cap" in failure.diagnosis.message
    assert LIMITS.max_envelope_bytes > MAX_PROGRAM_BYTES


def test_mutated_stablehlo_bytes_never_take_the_pool_down(sandbox: Sandbox) -> None:
    rng = np.random.default_rng(1)
    params = mlp_params(rng, 4, 8, 2)
    x = rng.standard_normal((2, 4), dtype=np.float32)
    exported = export_fn(mlp, *(spec(*p.shape) for p in params), spec(2, 4))
    seen: list[str] = []
    for blob in mutated_programs(exported, 12):
        result = sandbox.run(envelope_for(exported, [*params, x], program=blob))
        assert isinstance(result, InferenceResult | TaskFailure)
        seen.append("ok" if isinstance(result, InferenceResult) else result.diagnosis.category)
    print(f"\nmutations: {seen}")
    assert_still_serves(sandbox)


def test_ten_thousand_step_bomb_is_rejected_by_the_op_cap(sandbox: Sandbox) -> None:
    exported = export_fn(op_bomb, spec(4))
    failure = failed(
        sandbox.run(envelope_for(exported, [np.ones(4, np.float32)])), Category.UNSUPPORTED_OP
    )
    assert "op count" in failure.diagnosis.message
    assert_still_serves(sandbox)


def test_program_for_8_devices_on_one_cpu_is_device_count_mismatch(sandbox: Sandbox) -> None:
    exported = dataclasses.replace(export_fn(lambda x: x * 2, spec(4)), nr_devices=8)
    failed(
        sandbox.run(envelope_for(exported, [np.ones(4, np.float32)])),
        Category.DEVICE_COUNT_MISMATCH,
    )


@pytest.mark.parametrize("caller", ["thread", "loop"])
def test_endless_loop_is_killed_as_execute_timeout_and_worker_replaced(
    sandbox: Sandbox, caller: str
) -> None:
    before = {w.pid for w in sandbox.workers()}
    replaced = sandbox.replacements
    exported = export_fn(long_loop, spec(4))
    failure = failed(
        run_on(sandbox, envelope_for(exported, [np.ones(4, np.float32)]), caller),
        Category.EXECUTE_TIMEOUT,
    )
    assert failure.diagnosis.stage is Stage.EXECUTE
    assert sandbox.replacements == replaced + 1
    assert_still_serves(sandbox, caller)
    assert len(before - {w.pid for w in sandbox.workers()}) == 1  # the overdue one is gone


@pytest.mark.parametrize("caller", ["thread", "loop"])
def test_worker_killed_mid_task_is_classified_and_replaced(
    sandbox: Sandbox, killer: KillOnExecute, caller: str
) -> None:
    exported = export_fn(long_loop, spec(4))
    killer.armed = True
    failure = failed(
        run_on(sandbox, envelope_for(exported, [np.ones(4, np.float32)]), caller),
        Category.WORKER_CRASH,
    )
    # Without a namespace the daemon sees the signal; under bubblewrap the sandboxed worker's
    # death reaches it as the launcher's own exit code.
    message = failure.diagnosis.message
    if sandbox.isolation == "bwrap":
        assert message.startswith("worker ") and "during execute" in message
    else:
        assert "signal 9" in message
    assert failure.diagnosis.stage is Stage.EXECUTE
    assert killer.killed and killer.killed[-1] not in {w.pid for w in sandbox.workers()}
    assert_still_serves(sandbox, caller)


@pytest.mark.parametrize("caller", ["thread", "loop"])
def test_bomb_without_op_cap_hits_the_compile_timeout_then_close_refuses_tasks(
    tmp_path: Path, caller: str
) -> None:
    limits = SandboxLimits(max_ops=1_000_000, compile_timeout_s=2)
    exported = export_fn(op_bomb, spec(4))
    with Sandbox(1, limits, tmp_path, jax_platforms="cpu") as box:
        failure = failed(
            run_on(box, envelope_for(exported, [np.ones(4, np.float32)]), caller),
            Category.COMPILE_TIMEOUT,
        )
        assert failure.diagnosis.stage is Stage.COMPILE
        assert_still_serves(box, caller)
    with pytest.raises(SandboxClosedError):
        run_on(box, envelope_for(exported, [np.ones(4, np.float32)]), caller)
