"""A stage limit that passes while the host starves the worker is the provider's cost.

Real sandboxed workers (JAX on CPU). The host's load is made certain, not hoped for: the
worker is stopped (SIGSTOP) as soon as it reports its execute stage, so it gets no CPU at
all. Its execute limit passes; the task is not failed as an execute timeout (a billed
failure) but runs on towards its budget, and finishes once the worker gets CPU again.
A task still running at its budget ends a second past its deadline: late, never claimable,
refunded with the penalty (``provider/task_runner.py``).
"""

from __future__ import annotations

import asyncio
import os
import signal
import threading
from collections.abc import Iterator
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from provider.diagnosis import Stage
from provider.sandbox import InferenceResult, Sandbox, SandboxLimits, TaskFailure
from tests.polling import wait_until
from tests.provider.helpers import ran
from tests.provider.programs import envelope_for, export_fn, spec

STAGE_LIMIT_S = 2.0
BUDGET_S = 600.0


def spin(n: jax.Array, x: jax.Array) -> jax.Array:
    """Loop ``n[0]`` times: a task whose length the test chooses."""

    def body(carry: tuple[jax.Array, jax.Array]) -> tuple[jax.Array, jax.Array]:
        i, y = carry
        return i + 1, jnp.sin(y) + 1.0

    return jax.lax.while_loop(lambda c: c[0] < n[0], body, (jnp.int32(0), x))[1]


class Stopper:
    """Stops a worker (SIGSTOP) when it reports its execute stage, once armed."""

    def __init__(self) -> None:
        self.armed = False
        self.stopped: int | None = None
        self.lock = threading.Lock()

    def __call__(self, pid: int, stage: Stage) -> None:
        with self.lock:
            if self.armed and stage is Stage.EXECUTE and self.stopped is None:
                os.kill(pid, signal.SIGSTOP)
                self.stopped = pid


@pytest.fixture(scope="module")
def stopper() -> Stopper:
    return Stopper()


@pytest.fixture(scope="module")
def box(cache_dir: Path, stopper: Stopper) -> Iterator[Sandbox]:
    limits = SandboxLimits(execute_timeout_s=STAGE_LIMIT_S)
    with Sandbox(1, limits, cache_dir, jax_platforms="cpu", spares=0, on_stage=stopper) as sandbox:
        yield sandbox


@pytest.mark.parametrize("path", ["thread", "event_loop"])
def test_execute_limit_when_the_host_starves_the_worker_then_the_task_runs_on_to_its_budget(
    box: Sandbox, stopper: Stopper, path: str
) -> None:
    # A program of its own per path: a warm worker would report no stage to stop it at.
    offset = float(len(path))
    exported = export_fn(lambda n, x: spin(n, x) + offset, spec(1, dtype=jnp.int32), spec(4))
    steps = np.array([20_000_000], np.int32)
    envelope = envelope_for(exported, [steps, np.ones(4, np.float32)])
    outcome: list[InferenceResult | TaskFailure] = []
    stretched = box.stretched

    def submit() -> None:
        if path == "thread":
            outcome.append(box.run(envelope, budget_s=BUDGET_S))
        else:  # the daemon's inference path: the loop talks to the worker itself
            outcome.append(asyncio.run(box.run_async(envelope, budget_s=BUDGET_S)))

    with stopper.lock:
        stopper.armed, stopper.stopped = True, None
    task = threading.Thread(target=submit)
    task.start()
    try:
        wait_until(lambda: box.stretched > stretched, 120, "the starved stage moved to the budget")
    finally:
        with stopper.lock:
            stopped = stopper.stopped
        if stopped is not None:
            os.kill(stopped, signal.SIGCONT)
    task.join()
    assert stopped is not None
    ran(outcome[0])  # not an execute_timeout: the worker got no CPU to spend
    assert box.replacements == 0  # the worker was never killed
    # The next task finds it warm and ready.
    with stopper.lock:
        stopper.armed = False
    ran(box.run(envelope_for(exported, [np.array([10], np.int32), np.ones(4, np.float32)])))
