"""TPU-target compiles run in a compiler worker of their own: inference workers never load libtpu.

Real sandboxed workers (JAX on CPU, libtpu for the v5e compiles). Prints each worker's
resident memory before and after, for docs/benchmarks.md.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from provider.capacity import tpu_compiler_available
from provider.sandbox import Sandbox, SandboxLimits
from tests.provider.helpers import compiled, outputs, ran
from tests.provider.programs import envelope_for, export_fn, spec

pytestmark = pytest.mark.skipif(not tpu_compiler_available(), reason="libtpu not installed")


def _maps_libtpu(pid: int) -> bool:
    return "libtpu" in Path(f"/proc/{pid}/maps").read_text()


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmRSS for {pid}")


@pytest.fixture(scope="module")
def box(cache_dir: Path) -> Iterator[Sandbox]:
    """One executing worker, no spares: every task below lands on the same one."""
    with Sandbox(1, SandboxLimits(), cache_dir, jax_platforms="cpu", spares=0) as sandbox:
        yield sandbox


def test_tpu_compile_and_probe_when_run_then_only_the_compiler_worker_loads_libtpu(
    box: Sandbox, caplog: pytest.LogCaptureFixture
) -> None:
    exported = export_fn(lambda x: x * 2 + 1, spec(4), platforms=("cpu", "tpu"))
    x = np.arange(4, dtype=np.float32)
    ran(box.run(envelope_for(exported, [x])))
    (worker,) = box.workers()
    before = _rss_mib(worker.pid)
    assert box.compilers() == []  # nothing started it yet
    with caplog.at_level(logging.INFO, logger="provider.sandbox.worker"):
        report = compiled(box.compile(envelope_for(exported), "v5e:1x1"))
        capacity = box.capacity(benchmark=False, aot_targets=("v5e:1x1",))
    assert report.device_kind == "TPU v5 lite"
    assert [t.name for t in capacity.compile_targets] == ["v5e:1x1"]
    assert capacity.devices.platform == "cpu"
    (compiler,) = box.compilers()
    assert compiler.pid != worker.pid
    assert _maps_libtpu(compiler.pid)
    assert not _maps_libtpu(worker.pid)
    (y,) = outputs(ran(box.run(envelope_for(exported, [x]))))  # the same worker still serves
    np.testing.assert_allclose(y, x * 2 + 1)
    assert [w.pid for w in box.workers()] == [worker.pid]
    assert not _maps_libtpu(worker.pid)
    # libtpu's start-up lines on a chipless host are neither errors nor logged.
    said = "\n".join(record.getMessage() for record in caplog.records)
    assert "E0000" not in said and "INVALID_ARGUMENT" not in said, said
    assert "Failed to find host bounds" not in said, said
    after = _rss_mib(worker.pid)
    print(
        f"\ninference worker RSS: {before:.0f} MiB before the v5e compile, {after:.0f} MiB "
        f"after (libtpu not loaded); compiler worker RSS {_rss_mib(compiler.pid):.0f} MiB "
        "with libtpu"
    )
