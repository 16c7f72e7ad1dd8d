"""Compile caches no client can read or poison: per-client entries and reports, held by the daemon.

Client A's compiled programs are cached under A alone: client B's task of the same program
gets none of A's entries (it compiles afresh), and a compromised worker serving B (a real
spawned process speaking the worker protocol, ``tests/provider/cache_attacker.py``) finds no
cache directory to list, read or write, and what it plants through its replies (a forged
executable entry, a forged TPU compile report) is stored under B only: A's next tasks never
load it, and A's TPU compile is never answered from B's report.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from provider.sandbox import Sandbox, SandboxLimits, TaskFailure
from provider.sandbox.compile_store import CompileStore, client_id
from tests.provider.cache_attacker import FORGED_KEY, FORGED_TEMP_BYTES
from tests.provider.helpers import compiled
from tests.provider.programs import envelope_for, export_fn, mlp, mlp_params, spec

LIMITS = SandboxLimits(start_timeout_s=120)
ALICE = "0x" + "a1" * 20
BOB = "0x" + "b0" * 20


def _findings(result: object) -> dict[str, Any]:
    """What the compromised worker reported (its answer is a failure carrying JSON)."""
    assert isinstance(result, TaskFailure), result
    found: dict[str, Any] = json.loads(result.diagnosis.message)
    return found


def _program(rng: np.random.Generator) -> bytes:
    from programs.envelope import encode_envelope

    params = mlp_params(rng, 8, 16, 4)
    exported = export_fn(
        mlp, *(spec(*p.shape) for p in params), spec(2, 8), platforms=("cpu", "tpu")
    )
    return encode_envelope(envelope_for(exported))


def test_client_b_never_gets_client_a_cache_entries(tmp_path: Path) -> None:
    envelope = _program(np.random.default_rng(3))
    with Sandbox(1, LIMITS, tmp_path, jax_platforms="cpu", spares=0) as box:
        assert not compiled(box.compile(envelope, client=ALICE)).cache_hit
    stored = sorted((tmp_path / "clients").iterdir())
    assert [p.name for p in stored] == [client_id(ALICE)]  # A's entries, under A only

    with Sandbox(1, LIMITS, tmp_path, jax_platforms="cpu", spares=0) as box:  # fresh workers
        assert not compiled(box.compile(envelope, client=BOB)).cache_hit  # none of A's
        assert compiled(box.compile(envelope, client=ALICE)).cache_hit  # A's own store
        assert box.cache_cross_reads == 0
    assert {p.name for p in (tmp_path / "clients").iterdir()} == {client_id(ALICE), client_id(BOB)}


def test_compromised_worker_reads_nothing_and_its_plants_reach_no_other_client(
    tmp_path: Path,
) -> None:
    envelope = _program(np.random.default_rng(4))
    with Sandbox(1, LIMITS, tmp_path, jax_platforms="cpu", spares=0) as box:
        compiled(box.compile(envelope, client=ALICE))  # A's entries exist in the store
    attacker = "tests.provider.cache_attacker"
    with Sandbox(
        1, LIMITS, tmp_path, jax_platforms="cpu", spares=0, worker_module=attacker
    ) as evil:
        probe = evil.compile(envelope, "local", client=BOB)
        found = _findings(probe)
        print(json.dumps(found))
        assert found["listed"] == [] and found["read_bytes"] == 0  # no cache dir at all
        assert found["planted"] == "no directory"
        assert found["received"] == []  # the daemon sent B none of A's entries

        forged = compiled(evil.compile(envelope, "v5e:1x1", client=BOB))  # plants, forges
        assert forged.memory is not None and forged.memory.temp_bytes == FORGED_TEMP_BYTES
        again = compiled(evil.compile(envelope, "v5e:1x1", client=BOB))
        assert again.cache_hit  # B's own report: B fools only itself

        alice_probe = evil.compile(envelope, "local", client=ALICE)
        received = _findings(alice_probe)["received"]
        assert received and FORGED_KEY not in received  # A's own entries, not B's plant
        for_alice = compiled(evil.compile(envelope, "v5e:1x1", client=ALICE))
        assert not for_alice.cache_hit  # never served from B's report: a fresh compile
        bob_probe = evil.compile(envelope, "local", client=BOB)
        assert _findings(bob_probe)["received"] == [FORGED_KEY]
        assert evil.cache_cross_reads == 0

    with Sandbox(1, LIMITS, tmp_path, jax_platforms="cpu", spares=0) as box:
        honest = compiled(box.compile(envelope, client=ALICE))
        assert honest.cache_hit  # A's real entry, untouched by the attacker
        assert compiled(box.compile(envelope, "local", client=BOB)).cache_hit is False


def test_store_when_a_client_stores_past_its_bound_then_its_oldest_programs_go(
    tmp_path: Path,
) -> None:
    store = CompileStore(tmp_path, client_bytes=3 * 1000 + 100)
    for i in range(5):  # five programs of ~1 kB each from one client
        store.put_entries(BOB, bytes([i]) * 32, {f"jit_f-{i:02x}": b"x" * 1000})
    store.put_entries(ALICE, b"\xaa" * 32, {"jit_f-aa": b"y" * 1000})
    kept = [i for i in range(5) if store.entries(BOB, bytes([i]) * 32)]
    assert kept == [2, 3, 4] and store.evicted == 2  # the oldest went, within B's bound
    assert store.entries(ALICE, b"\xaa" * 32) == {"jit_f-aa": b"y" * 1000}  # A untouched
    assert store.put_entries(BOB, b"\x09" * 32, {"../escape": b"z", "ok-key": b""}) == 0
