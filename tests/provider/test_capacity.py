"""Capacity discovery and a two-worker pool serving concurrent tasks."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from contracts.messages import Domain
from provider.capacity import (
    Capacity,
    CompileTarget,
    DeviceInfo,
    capacity_from_wire,
    capacity_to_wire,
    compile_class,
    device_class,
    tpu_chips_present,
    tpu_compiler_available,
)
from provider.heartbeat import build_advert
from provider.sandbox import InferenceResult, Sandbox, SandboxLimits
from tests.provider.daemon_support import PLAN
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
    assert capacity.devices.device_class == "cpu"
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


@pytest.mark.parametrize(
    ("platform", "kind", "expected"),
    [
        ("cpu", "cpu", "cpu"),
        ("tpu", "TPU v5 lite", "tpu-v5e"),
        ("tpu", "TPU v5", "tpu-v5p"),
        ("tpu", "TPU v4", "tpu-v4"),
        ("tpu", "TPU v6 lite", "tpu-v6e"),
        ("tpu", "TPU v9 lite", "tpu-v9e"),
        ("gpu", "NVIDIA H100 80GB HBM3", "gpu-h100"),
        ("gpu", "NVIDIA H200", "gpu-h200"),
        ("cuda", "NVIDIA A100-SXM4-40GB", "gpu-a100"),
        ("gpu", "Tesla V100-SXM2-16GB", "gpu-v100"),
        ("gpu", "NVIDIA L4", "gpu-l4"),
        ("gpu", "NVIDIA GeForce RTX 4090", "gpu-rtx4090"),
        ("gpu", "???", "gpu"),
    ],
)
def test_device_class_names_the_devices_a_host_runs_on(
    platform: str, kind: str, expected: str
) -> None:
    assert device_class(platform, kind) == expected


def capacity_of(platform: str, kind: str, targets: tuple[str, ...]) -> Capacity:
    return Capacity(
        devices=DeviceInfo(platform=platform, device_kind=kind, count=1, memory_bytes=None),
        jax_version="0",
        jaxlib_version="0",
        calling_convention_min=9,
        calling_convention_max=10,
        stablehlo_min="1.0.0",
        stablehlo_max="1.0.0",
        compile_targets=tuple(CompileTarget(t, "TPU v5 lite", 1, 16 << 30) for t in targets),
        benchmark=None,
    )


@pytest.mark.parametrize(
    ("platform", "kind", "targets", "sold"),
    [
        ("cpu", "cpu", ("v5e:1x1",), "cpu"),  # compile checks for v5e, run time on a CPU
        ("tpu", "TPU v5 lite", ("v5e:1x1", "v5e:2x2"), "tpu-v5e"),
        ("gpu", "NVIDIA H100 80GB HBM3", (), "gpu-h100"),
    ],
)
def test_advert_sells_the_device_class_it_runs_on_and_lists_compile_targets_apart(
    platform: str, kind: str, targets: tuple[str, ...], sold: str
) -> None:
    advert = build_advert(
        capacity=capacity_of(platform, kind, targets),
        plan=PLAN,
        slo_ms=2_000,
        endpoint="http://127.0.0.1:8700",
        domain=Domain(chain_id=31337, verifying_contract="0x" + "11" * 20),
    )
    assert advert["device_class"] == sold
    assert advert["compile_targets"] == list(targets)


@pytest.mark.skipif(
    not tpu_compiler_available() or tpu_chips_present(),
    reason="host: needs libtpu on a host without TPU chips",
)
def test_discover_on_a_cpu_host_with_libtpu_then_no_libtpu_error_lines() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TPU_")}
    env["JAX_PLATFORMS"] = "cpu"
    probe = (
        "from provider.capacity import discover\n"
        "c = discover(benchmark=False)\n"
        "print([t.name for t in c.compile_targets], c.devices.device_class)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "['v5e:1x1'] cpu"
    assert "E0000" not in done.stderr and "unexpected worker hostname" not in done.stderr


@pytest.mark.parametrize(
    ("target", "expected"),
    [("v5e:1x1", "compile-v5e"), ("v5e:2x2", "compile-v5e"), ("v4:2x2x1", "compile-v4")],
)
def test_compile_class_names_the_compile_checks_of_a_tpu_generation(
    target: str, expected: str
) -> None:
    assert compile_class(target) == expected
