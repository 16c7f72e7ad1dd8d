"""Host memory admission: every task's memory counted in one ledger against the host's RAM.

Two programs that each fit alone but not together are never admitted at once: with most of
the ledger held by another task, a program's first try gets only a small allowance, fails
its worker's memory check with its real need, waits until that much is free, and then runs.
Waits are observed by polling the ledger, never timed.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from provider.diagnosis import Category
from provider.sandbox import Sandbox, SandboxLimits
from provider.sandbox.host_memory import HostMemory, host_total_bytes
from tests.provider.helpers import failed, ran
from tests.provider.programs import envelope_for, export_fn, spec

MIB = 1 << 20
BUDGET = 64 * MIB
WIDE = 4 * MIB  # float32 outputs: a program that needs ~16 MiB


def _until(condition: Callable[[], bool], what: str, timeout_s: float = 300.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.01)


def widen(x: jax.Array) -> jax.Array:
    return jnp.broadcast_to(x * 2.0, (WIDE,))


@pytest.fixture(scope="module")
def box(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sandbox]:
    with Sandbox(
        1,
        SandboxLimits(),
        tmp_path_factory.mktemp("store"),
        jax_platforms="cpu",
        spares=0,
        host_memory=HostMemory(BUDGET),
    ) as sandbox:
        yield sandbox


def test_ledger_is_the_hosts_physical_memory() -> None:
    total = host_total_bytes()
    assert total is not None and total > 0
    ledger = HostMemory.of_host(0.5)
    assert ledger is not None and ledger.budget_bytes == int(total * 0.5)


def test_ledger_when_two_fit_alone_not_together_then_second_waits_for_first() -> None:
    ledger = HostMemory(100)
    first = ledger.reserve(60)
    got: list[int] = []
    second = threading.Thread(target=lambda: got.append(ledger.reserve(60).amount))
    second.start()
    _until(lambda: ledger.waiting == 1, "the second reservation waits")
    assert got == [] and ledger.reserved == 60
    ledger.release(first)
    second.join()
    assert got == [60] and ledger.peak <= 100


def test_program_when_host_memory_held_elsewhere_then_waits_and_runs_after(
    box: Sandbox,
) -> None:
    ledger = box.admission.memory
    assert ledger is not None
    envelope = envelope_for(export_fn(widen, spec(1)), [np.array([1.5], np.float32)])
    other = ledger.reserve(BUDGET - 8 * MIB)  # another worker's program holds most of it
    results: list[object] = []
    task = threading.Thread(target=lambda: results.append(box.run(envelope, client="0xc1")))
    task.start()
    _until(lambda: ledger.waiting == 1, "the program waits for host memory")
    assert results == []  # not admitted beside the other one
    ledger.release(other)
    task.join()
    result = ran(results[0])  # type: ignore[arg-type]
    assert result.outputs and ledger.peak <= BUDGET and ledger.reserved == 0


def test_program_larger_than_the_host_budget_is_refused_as_oom(box: Sandbox) -> None:
    def huge(x: jax.Array) -> jax.Array:
        return jnp.broadcast_to(x * 2.0, (32 * MIB,))  # 128 MiB of outputs

    envelope = envelope_for(export_fn(huge, spec(1)), [np.array([1.0], np.float32)])
    failure = failed(box.run(envelope, client="0xc1"), Category.OOM)
    assert failure.diagnosis.required_bytes is not None
    assert failure.diagnosis.required_bytes > BUDGET
    assert box.admission.memory is not None and box.admission.memory.reserved == 0
