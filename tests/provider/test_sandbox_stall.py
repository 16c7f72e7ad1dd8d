"""Malformed programs do not stall the next client: a validator apart from the workers parses them.

A program not seen before is parsed and checked by a validator process (CPU, lower priority)
before any executing worker sees it. Programs the StableHLO parser rejects retire that
validator after a few (here 2) refusals, never an executing worker: the honest task right
after two such programs runs on its warm worker and waits for no start.
Latencies are printed, not asserted.
"""

from __future__ import annotations

import dataclasses
import os
import statistics
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from provider.diagnosis import Category
from provider.sandbox import Sandbox, SandboxLimits
from provider.sandbox.sandbox import VALIDATOR_NICE
from tests.provider.helpers import failed, ran
from tests.provider.programs import envelope_for, export_fn, mlp, mlp_params, spec

ROUNDS = 5
LIMITS = SandboxLimits(
    validate_timeout_s=20, compile_timeout_s=60, execute_timeout_s=10, validator_refusals=2
)


@pytest.fixture(scope="module")
def box(cache_dir: Path) -> Iterator[Sandbox]:
    """One worker and the default spares, as a small daemon has."""
    with Sandbox(1, LIMITS, cache_dir, jax_platforms="cpu") as sandbox:
        yield sandbox


def _all_ready(sandbox: Sandbox, timeout_s: float = 180.0) -> None:
    """Wait until the two workers and two validators are started (readiness of processes)."""
    deadline = time.monotonic() + timeout_s
    while len(sandbox.workers()) < 2 or len(sandbox.validators()) < 2:
        assert time.monotonic() < deadline, "the spares did not start"
        time.sleep(0.05)


def _malformed(rng: np.random.Generator) -> bytes:
    """A program whose StableHLO bytecode is garbage after a valid header."""
    base = export_fn(lambda x: x * 2, spec(4))
    header = base.mlir_module_serialized[: len(b"ML\xefR") + 1 + len("StableHLO_v1.15.0") + 1]
    body = rng.integers(0, 256, 256, dtype=np.uint8).tobytes()
    return bytes(dataclasses.replace(base, mlir_module_serialized=header + body).serialize())


def test_honest_task_after_two_malformed_waits_for_no_worker_start(
    box: Sandbox, rng: np.random.Generator
) -> None:
    params = mlp_params(rng, 4, 8, 2)
    exported = export_fn(mlp, *(spec(*p.shape) for p in params), spec(2, 4))
    x = rng.standard_normal((2, 4)).astype(np.float32)
    honest = envelope_for(exported, [*params, x])
    base = export_fn(lambda x: x * 2, spec(4))
    ran(box.run(honest))  # compiled once: later runs are warm
    _all_ready(box)

    alone = []
    for _ in range(ROUNDS):
        started = time.perf_counter()
        ran(box.run(honest))
        alone.append(time.perf_counter() - started)

    after = []
    workers = {w.pid for w in box.workers()}
    replaced_before = box.replacements
    for _ in range(ROUNDS):
        _all_ready(box)
        waits = box.start_waits
        for _ in range(2):
            bad = envelope_for(base, [np.ones(4, np.float32)], program=_malformed(rng))
            failed(box.run(bad), Category.MALFORMED_INPUT)
        started = time.perf_counter()
        ran(box.run(honest))
        after.append(time.perf_counter() - started)
        assert box.start_waits == waits  # nobody waited for a worker to start
        assert {w.pid for w in box.workers()} == workers  # no executing worker was retired

    # Each validator retires at its 2nd refusal; the two alive at the end hold one at most.
    assert box.replacements - replaced_before >= (2 * ROUNDS - 2) // 2
    ratio = statistics.median(after) / statistics.median(alone)
    print(
        f"honest task alone: median {statistics.median(alone) * 1000:.1f} ms; right after 2 "
        f"malformed: median {statistics.median(after) * 1000:.1f} ms "
        f"({min(after) * 1000:.1f}-{max(after) * 1000:.1f}); ratio {ratio:.2f}"
    )


def test_validators_run_on_the_cpu_at_the_lowest_priority(box: Sandbox) -> None:
    _all_ready(box)
    validators = box.validators()
    assert validators and all(v.platform == "cpu" for v in validators)
    for info in [*validators, *box.workers()]:
        fields = Path(f"/proc/{info.pid}/stat").read_text().rsplit(")", 1)[1].split()
        nice = int(fields[16])  # field 19 of /proc/<pid>/stat
        assert nice == (VALIDATOR_NICE if info in validators else os.nice(0)), info
    assert {v.pid for v in validators}.isdisjoint({w.pid for w in box.workers()})
