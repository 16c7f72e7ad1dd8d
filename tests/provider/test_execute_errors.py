"""A program that fails while it executes, without killing its worker, is an ``execute_error``.

The program: a Cholesky factorization whose LAPACK custom call states its ``uplo`` option as
an ``i32`` instead of the ``ui8`` the kernel's binding decodes. It passes every check (the
option's value is one the kernel accepts) and compiles; XLA's FFI layer then refuses to decode
the call's attributes when the call runs, before the kernel touches any buffer. XLA raises,
the worker catches it and lives on: the client must see ``execute_error`` (never
``worker_crash``), the runtime's own line and the category's hints, and the same worker must
serve the next honest task. Real programs through a real sandbox worker and a real daemon.
"""

from __future__ import annotations

import base64
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jax.numpy as jnp
import numpy as np
import pytest
from fastapi.testclient import TestClient

from contracts.messages import Receipt, address_of, verify
from programs.envelope import ArrayFormat, ProgramEnvelope, decode_arrays
from provider.daemon import Daemon
from provider.diagnosis import HINTS, Category, Stage
from provider.sandbox import Sandbox, SandboxLimits
from tests.polling import wait_until
from tests.provider.daemon_support import ChainWorld, sign_task
from tests.provider.helpers import failed, outputs, ran
from tests.provider.programs import envelope_for, export_fn, spec, with_module_text

HONEST_OPTION = "uplo = 76 : ui8"
MISTYPED_OPTION = "uplo = 76 : i32"
RUNTIME_LINE = "INVALID_ARGUMENT: [execute] Failed to decode all FFI handler operands"


def _cholesky_envelopes() -> tuple[ProgramEnvelope, ProgramEnvelope, np.ndarray[Any, Any]]:
    """Return (honest, mistyped) envelopes of a 3x3 Cholesky and their input."""
    base = export_fn(lambda x: jnp.linalg.cholesky(x), spec(3, 3))
    text = base.mlir_module()
    assert text.count(HONEST_OPTION) == 1  # the LAPACK potrf call JAX emits on CPU
    mistyped = with_module_text(base, text.replace(HONEST_OPTION, MISTYPED_OPTION))
    x = np.array([[4.0, 2.0, 0.0], [2.0, 5.0, 1.0], [0.0, 1.0, 3.0]], np.float32)
    return envelope_for(base, [x]), envelope_for(base, [x], program=mistyped), x


@pytest.fixture(scope="module")
def box(cache_dir: Path) -> Iterator[Sandbox]:
    """One worker and no spare: a retired worker would show as a new pid."""
    with Sandbox(1, SandboxLimits(), cache_dir, jax_platforms="cpu", spares=0) as sandbox:
        yield sandbox


def test_runtime_error_while_executing_is_execute_error_and_the_worker_serves_on(
    box: Sandbox,
) -> None:
    honest, mistyped, x = _cholesky_envelopes()
    (first,) = outputs(ran(box.run(honest)))
    np.testing.assert_allclose(first, np.linalg.cholesky(x), rtol=1e-5)
    (worker,) = box.workers()
    replaced = box.replacements

    for attempt in range(2):  # a failed run leaves nothing warm: the second fails alike
        failure = failed(box.run(mistyped), Category.EXECUTE_ERROR)
        diagnosis = failure.diagnosis
        assert diagnosis.stage is Stage.EXECUTE
        assert diagnosis.code == 11
        assert diagnosis.message.startswith(RUNTIME_LINE), diagnosis.message
        assert diagnosis.hints == HINTS[Category.EXECUTE_ERROR]
        assert failure.program_sha256 == mistyped.program_sha256
        if attempt == 0:  # it compiled (the second reuses that): the error is the run's
            assert failure.compile_time_s > 0

    (after,) = outputs(ran(box.run(honest)))
    np.testing.assert_allclose(after, first)
    assert [w.pid for w in box.workers()] == [worker.pid]
    assert box.replacements == replaced


def test_daemon_reports_execute_error_with_its_receipt_and_runs_the_next_task(
    api: TestClient, chain_world: ChainWorld, daemon: Daemon
) -> None:
    world = chain_world
    honest, mistyped, x = _cholesky_envelopes()
    deal_id = world.open_deal()

    def submit(index: int, envelope: ProgramEnvelope) -> dict[str, Any]:
        task = sign_task(world, world.client, deal_id, index, envelope)
        reply = api.post(
            "/v1/tasks", content=task.body, headers=task.headers(), params={"wait": 60}
        )
        assert reply.status_code == 200, reply.text
        body: dict[str, Any] = reply.json()
        receipt = Receipt.from_json(body["receipt"])
        signature = bytes.fromhex(body["receipt_signature"].removeprefix("0x"))
        verify(receipt, world.domain, signature, address_of(world.provider))
        body["receipt"] = receipt
        return body

    # The daemon's worker and its spare both started (a loaded host starts the spare late,
    # which must not read as a worker retired and replaced).
    wait_until(lambda: len(daemon.sandbox.workers()) == 2, 300, "the worker and its spare")
    workers = sorted(w.pid for w in daemon.sandbox.workers())
    bad = submit(0, mistyped)
    assert bad["state"] == "failed", bad
    assert bad["diagnosis"]["category"] == Category.EXECUTE_ERROR.value
    assert bad["diagnosis"]["message"].startswith(RUNTIME_LINE), bad["diagnosis"]
    assert tuple(bad["diagnosis"]["hints"]) == HINTS[Category.EXECUTE_ERROR]
    assert bad["receipt"].status == Category.EXECUTE_ERROR.code

    good = submit(1, honest)
    assert good["state"] == "succeeded", good
    assert good["receipt"].status == 0
    (factor,) = decode_arrays(
        base64.b64decode(good["outputs_b64"]), ArrayFormat.SAFETENSORS
    ).values()
    np.testing.assert_allclose(np.asarray(factor, np.float32), np.linalg.cholesky(x), rtol=1e-5)
    assert sorted(w.pid for w in daemon.sandbox.workers()) == workers
