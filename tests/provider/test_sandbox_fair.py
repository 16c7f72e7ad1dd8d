"""Fair time on the workers: per-client queues served in turn, a budget that kills an overrun.

An attacker that queued several slow tasks first does not delay an honest client's task
behind all of them: the honest task is started at the next free worker (the order in which
tasks were let in is checked, never durations). A task that runs past its wall-clock budget
(an endless loop) kills its worker and fails as a timeout; the next task runs on a fresh one.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import jax
import numpy as np
import pytest

from provider.diagnosis import Category
from provider.sandbox import Sandbox, SandboxLimits, TaskFailure
from provider.sandbox.compile_store import client_id
from provider.sandbox.fair import FairGate
from tests.provider.helpers import failed, ran
from tests.provider.programs import envelope_for, export_fn, spec

ATTACKER = "0x" + "ee" * 20
HONEST = "0x" + "c1" * 20
BUDGET_S = 3.0  # the attacker's tasks are killed at this budget (their deadline)
LIMITS = SandboxLimits(start_timeout_s=120, execute_timeout_s=60)


def _until(condition: object, what: str, timeout_s: float = 300.0) -> None:
    """Poll ``condition`` (a callable) until it holds."""
    deadline = time.monotonic() + timeout_s
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline, what
        time.sleep(0.01)


def endless(x: jax.Array) -> jax.Array:
    """A valid program that never ends: the loop's condition holds for every float."""
    return jax.lax.while_loop(lambda c: c[0] == c[0], lambda c: c * 1.5 + 1.0, x)


@pytest.fixture(scope="module")
def box() -> Iterator[Sandbox]:
    with Sandbox(1, LIMITS, None, jax_platforms="cpu", spares=1) as sandbox:
        yield sandbox


def test_gate_when_attacker_queued_first_then_honest_let_in_next() -> None:
    gate = FairGate(slots=1, per_client=1)
    gate.enter("attacker")  # its first task holds the only slot
    threads = [threading.Thread(target=gate.enter, args=("attacker",)) for _ in range(3)]
    for thread in threads:
        thread.start()
    _until(lambda: gate.waiting("attacker") == 3, "the attacker's tasks queued")
    honest = threading.Thread(target=gate.enter, args=("honest",))
    honest.start()
    _until(lambda: gate.waiting("honest") == 1, "the honest task queued")

    for _ in range(4):  # each task done lets the next one in, at once
        gate.leave(gate.schedule[-1])
    for thread in [*threads, honest]:
        thread.join()
    assert list(gate.schedule) == ["attacker", "honest", "attacker", "attacker", "attacker"]
    assert gate.running("attacker") + gate.running("honest") == 1


def test_gate_caps_one_client_to_its_share_of_the_slots() -> None:
    gate = FairGate(slots=2, per_client=1)
    gate.enter("attacker")
    queued = threading.Thread(target=gate.enter, args=("attacker",))
    queued.start()
    _until(lambda: gate.waiting("attacker") == 1, "the attacker's 2nd task queued")
    gate.enter("honest")  # the second slot was kept from the attacker: no wait
    assert gate.running("attacker") == 1 and gate.waiting("attacker") == 1
    gate.leave("attacker")
    queued.join()
    assert list(gate.schedule) == ["attacker", "honest", "attacker"]


def test_sandbox_when_attacker_queues_endless_loops_then_honest_scheduled_next(
    box: Sandbox,
) -> None:
    loop = envelope_for(export_fn(endless, spec(1)), [np.ones(1, np.float32)])
    honest = envelope_for(export_fn(lambda x: x * 2, spec(4)), [np.ones(4, np.float32)])
    ran(box.run(honest, client=HONEST))  # validated and compiled once
    replaced = box.replacements
    results: dict[str, list[object]] = {"attacker": [], "honest": []}

    def attack() -> None:
        results["attacker"].append(box.run(loop, client=ATTACKER, budget_s=BUDGET_S))

    attackers = [threading.Thread(target=attack) for _ in range(3)]
    attackers[0].start()
    tenant = client_id(ATTACKER)
    _until(lambda: box.gate.running(tenant) == 1, "the attacker's first task started")
    for thread in attackers[1:]:
        thread.start()
    _until(lambda: box.gate.waiting(tenant) == 2, "the attacker's later tasks queued")
    start = len(box.gate.schedule)
    results["honest"].append(box.run(honest, client=HONEST))
    for thread in attackers:
        thread.join()

    order = list(box.gate.schedule)[start - 1 :]
    assert order == [tenant, client_id(HONEST), tenant, tenant]
    ran(results["honest"][0])  # type: ignore[arg-type]
    for outcome in results["attacker"]:
        assert isinstance(outcome, TaskFailure)
        failed(outcome, Category.EXECUTE_TIMEOUT)  # killed at its budget
    assert box.replacements >= replaced + 3  # each overrun cost only its own worker
    ran(box.run(honest, client=HONEST))
    # New programs: one client holds one validator at most, another is always left.
    assert box.validator_gate.per_client == 1 < box.validator_gate.slots


def test_endless_loop_within_budget_is_killed_and_costs_only_its_task(box: Sandbox) -> None:
    loop = envelope_for(export_fn(endless, spec(1)), [np.ones(1, np.float32)])
    failure = failed(box.run(loop, client=ATTACKER, budget_s=BUDGET_S), Category.EXECUTE_TIMEOUT)
    assert failure.diagnosis.message
    honest = envelope_for(export_fn(lambda x: x + 1, spec(2)), [np.zeros(2, np.float32)])
    ran(box.run(honest, client=HONEST))
