"""Delivered outputs within a byte budget: many large outputs leave the daemon's memory flat,
and every result stays fetchable, byte for byte (real anvil, escrow, sandbox and app)."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from fastapi.testclient import TestClient

from contracts.messages import Receipt
from programs.envelope import ArrayFormat, ProgramEnvelope, decode_arrays
from provider.daemon import Daemon
from provider.errors import ConfigError
from provider.output_memory import OUTPUT_MEMORY_ENV, OutputMemory, output_memory_budget
from provider.sandbox import Sandbox
from tests.provider.access_support import proof
from tests.provider.daemon_support import ChainWorld, provider_config, sign_task
from tests.provider.programs import envelope_for, export_fn, spec

MIB = 1024 * 1024
BUDGET = 96 * MIB  # four 20 MiB outputs (one may take a quarter)
OUTPUT_FLOATS = 5 * MIB  # 20 MiB of float32 per task
TASKS = 30


def widen(x: jax.Array) -> jax.Array:
    """Return ``OUTPUT_FLOATS`` copies of ``2 x``: a small input, a large output."""
    return jnp.broadcast_to(x * 2.0, (OUTPUT_FLOATS,))


def widen_envelope(value: float) -> ProgramEnvelope:
    return envelope_for(export_fn(widen, spec(1)), [np.array([value], np.float32)])


def rss_mb(pid: int | str = "self") -> float:
    """Return a process's resident set size in MB (from /proc)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmRSS for {pid}")


@pytest.fixture(scope="module")
def daemon(
    chain_world: ChainWorld, sandbox: Sandbox, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Daemon]:
    """A daemon whose output memory budget is set by its environment variable."""
    data = tmp_path_factory.mktemp("provider-data")
    before = os.environ.get(OUTPUT_MEMORY_ENV)
    os.environ[OUTPUT_MEMORY_ENV] = str(BUDGET)
    try:
        node = Daemon(provider_config(chain_world, data), chain=chain_world.chain, sandbox=sandbox)
    finally:
        if before is None:
            del os.environ[OUTPUT_MEMORY_ENV]
        else:
            os.environ[OUTPUT_MEMORY_ENV] = before
    node.start(schedule=False)
    try:
        yield node
    finally:
        node.close()


# ---- the budget's bookkeeping ---------------------------------------------------------------


def test_output_memory_when_over_budget_then_oldest_dropped_and_large_never_kept() -> None:
    memory = OutputMemory(100, max_items=3)

    kept = [memory.put((1, i), bytes([i]) * 20) for i in range(6)]
    large = memory.put((2, 0), b"x" * 26)

    assert kept == [True] * 6 and large is False
    assert memory.held_bytes == 60 and len(memory) == 3  # max_items: the oldest three went
    assert [memory.get((1, i)) for i in range(3)] == [None] * 3
    assert memory.get((1, 5)) == bytes([5]) * 20 and memory.get((2, 0)) is None
    assert memory.evicted == 3 and memory.not_kept == 1
    memory.put((1, 6), b"y" * 25)
    memory.put((1, 7), b"z" * 25)
    assert memory.held_bytes <= 100


def test_output_memory_budget_when_env_set_then_read_and_garbage_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(OUTPUT_MEMORY_ENV, raising=False)
    assert output_memory_budget() == 256 * MIB
    monkeypatch.setenv(OUTPUT_MEMORY_ENV, "0")
    assert output_memory_budget() == 0 and OutputMemory(0).put((1, 1), b"") is True
    for bad in ("lots", "-1"):
        monkeypatch.setenv(OUTPUT_MEMORY_ENV, bad)
        with pytest.raises(ConfigError):
            output_memory_budget()


# ---- many large outputs through the real daemon ---------------------------------------------


def _run(api: TestClient, world: ChainWorld, deal_id: int, index: int) -> dict[str, Any]:
    task = sign_task(world, world.client, deal_id, index, widen_envelope(float(index)))
    reply = api.post("/v1/tasks", content=task.body, headers=task.headers(), params={"wait": 60})
    assert reply.status_code == 200, reply.text[:300]
    body: dict[str, Any] = reply.json()
    assert body["state"] == "succeeded", body.get("diagnosis")
    assert body["outputs_b64"] is None and body["outputs_size"] > OUTPUT_FLOATS * 4
    return body


def _fetch(api: TestClient, world: ChainWorld, deal_id: int, index: int) -> bytes:
    reply = api.get(
        f"/v1/tasks/{deal_id}/{index}/outputs", headers=proof(world, world.client, deal_id, index)
    )
    assert reply.status_code == 200, reply.text[:300]
    return reply.content


def test_large_outputs_when_many_delivered_then_memory_within_budget_and_results_identical(
    api: TestClient, chain_world: ChainWorld, daemon: Daemon
) -> None:
    world = chain_world
    deal_id = world.open_deal(max_spend=10**9)
    memory = daemon.service.outputs
    _run(api, world, deal_id, 0)  # warm-up: compile, first worker buffers, journal pages
    _run(api, world, deal_id, 1)
    workers = [w.pid for w in daemon.sandbox.workers()]
    daemon_before = rss_mb()
    workers_before = sum(rss_mb(pid) for pid in workers)

    answers = {i: _run(api, world, deal_id, i) for i in range(2, TASKS + 2)}

    daemon_growth = rss_mb() - daemon_before
    workers_growth = sum(rss_mb(pid) for pid in workers) - workers_before
    print(
        f"\n{TASKS} outputs of {OUTPUT_FLOATS * 4 / MIB:.0f} MiB, budget {BUDGET / MIB:.0f} MiB: "
        f"daemon RSS {daemon_before:.0f} -> +{daemon_growth:.0f} MB, workers "
        f"{workers_before:.0f} -> +{workers_growth:.0f} MB; in memory {len(memory)} outputs, "
        f"{memory.held_bytes / MIB:.0f} MiB, evicted {memory.evicted}"
    )
    assert memory.budget_bytes == BUDGET
    assert memory.held_bytes <= BUDGET and memory.evicted >= TASKS + 2 - BUDGET // (20 * MIB)
    assert memory.get((deal_id, 2)) is None and memory.get((deal_id, TASKS + 1)) is not None
    assert daemon_growth < TASKS * 20 / 2  # all kept would be +600 MB
    for index in (2, TASKS // 2, TASKS + 1):  # dropped from memory (journal), and still held
        data = _fetch(api, world, deal_id, index)
        receipt = Receipt.from_json(answers[index]["receipt"])
        assert hashlib.sha256(data).digest() == receipt.output_hash
        assert len(data) == answers[index]["outputs_size"]
        (output,) = decode_arrays(data, ArrayFormat.SAFETENSORS).values()
        np.testing.assert_array_equal(output, np.full(OUTPUT_FLOATS, 2.0 * index, np.float32))
