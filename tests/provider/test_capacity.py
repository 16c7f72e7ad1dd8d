"""Capacity discovery and a two-worker pool serving concurrent tasks."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from provider.capacity import capacity_from_wire, capacity_to_wire, tpu_compiler_available
from provider.sandbox import InferenceResult, Sandbox, SandboxLimits
from tests.provider.helpers import outputs
from tests.provider.programs import envelope_for, export_fn, mlp, mlp_params, spec


@pytest.fixture(scope="module")
def sandbox(cache_dir: Path) -> Iterator[Sandbox]:
    """Two workers, to check concurrent use."""
    with Sandbox(2, SandboxLimits(), cache_dir, jax_platforms="cpu") as box:
        yield box


def test_capacity_reads_devices_versions_targets_and_measures_speed(sandbox: Sandbox) -> None:
    capacity = sandbox.capacity()
    assert capacity.devices.platform == "cpu"
    assert capacity.devices.device_kind == "cpu"
    assert capacity.devices.count >= 1
    assert capacity.jax_version == "0.10.2"
    assert capacity.calling_convention_min <= 10 <= capacity.calling_convention_max
    assert capacity.benchmark is not None and capacity.benchmark.gflops > 0
    if tpu_compiler_available():
        (v5e,) = capacity.compile_targets
        assert (v5e.name, v5e.device_kind, v5e.chips) == ("v5e:1x1", "TPU v5 lite", 1)
        assert v5e.hbm_bytes is not None and 15 << 30 < v5e.hbm_bytes <= 16 << 30
    assert capacity_from_wire(capacity_to_wire(capacity)) == capacity
    print(f"\ncapacity: {capacity}")


def test_two_workers_serve_concurrent_tasks(sandbox: Sandbox) -> None:
    workers = sandbox.workers()
    assert len({w.pid for w in workers}) == 2
    print(
        f"\nworker start (spawn to ready, incl. JAX import and warm-up): "
        f"{[round(w.start_s, 2) for w in workers]} s"
    )
    rng = np.random.default_rng(3)
    params = mlp_params(rng)
    exported = export_fn(mlp, *(spec(*p.shape) for p in params), spec("b", 32))
    xs = [rng.standard_normal((n, 32), dtype=np.float32) for n in range(1, 9)]
    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda x: sandbox.run(envelope_for(exported, [*params, x])), xs))
    for x, result in zip(xs, results, strict=True):
        assert isinstance(result, InferenceResult), result
        np.testing.assert_allclose(outputs(result)[0], mlp(*params, x), rtol=1e-5, atol=1e-5)
