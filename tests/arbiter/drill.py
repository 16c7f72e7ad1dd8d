"""A disputed task, end to end: a real program, a real escrow, a real arbiter process.

Shared by the arbiter's tests and ``scripts/dispute-drill``: the parties act on chain with what
each honestly holds (or, as adversaries, with what they choose), the arbiter is
``python -m provider.arbiter.cli run``.
"""

from __future__ import annotations

import hashlib
import os
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from contracts.chain import free_port
from contracts.evidence import Role, upload_evidence
from contracts.messages import KIND_INFERENCE, STATUS_SUCCESS, Ack, Receipt, address_of
from contracts.pricing import price_receipt
from programs.envelope import ArrayFormat, decode_arrays, encode_arrays, encode_envelope
from provider.sandbox import InferenceResult, Sandbox
from tests import processes
from tests.contracts.builders import DEFAULT_PLAN, SignedTask, claim, open_deal
from tests.contracts.conftest import World
from tests.polling import wait_until
from tests.provider.programs import envelope_for, export_fn, mlp, mlp_params, spec

ROOT = Path(__file__).resolve().parents[2]
EVIDENCE_WINDOW_S = 120
PENALTY = 50_000


@dataclass(frozen=True)
class Job:
    """A real program, its arguments as the client sent them, and the honest outputs."""

    envelope: bytes
    program_sha256: bytes
    inputs_sha256: bytes
    outputs: bytes


def make_job() -> Job:
    """Export an MLP, run it once in the provider's sandbox: the honest outputs."""
    rng = np.random.default_rng(3)
    params = mlp_params(rng)
    x = rng.standard_normal((4, 32), dtype=np.float32)
    exported = export_fn(mlp, *(spec(*p.shape) for p in params), spec(4, 32))
    envelope = envelope_for(exported, [*params, x])
    with Sandbox(pool_size=1, jax_platforms="cpu") as sandbox:
        ran = sandbox.run(envelope)
    assert isinstance(ran, InferenceResult)
    return Job(
        envelope=encode_envelope(envelope),
        program_sha256=envelope.program_sha256,
        inputs_sha256=envelope.inputs_sha256,
        outputs=ran.outputs,
    )


def altered(outputs: bytes) -> bytes:
    arrays = decode_arrays(outputs, ArrayFormat.SAFETENSORS)
    return encode_arrays({k: np.asarray(v, np.float32) + 0.5 for k, v in arrays.items()})


def signed_delivery(
    world: World, deal_id: int, index: int, job: Job, outputs: bytes, c: str, p: str
) -> SignedTask:
    """A task the client requested (signing the program's hashes), receipted by the provider."""
    due = world.now() + 100
    draft = Receipt(
        deal_id=deal_id,
        task_index=index,
        kind=KIND_INFERENCE,
        status=STATUS_SUCCESS,
        cache_hit=False,
        device_ms=40,
        compile_ms=0,
        program_hash=job.program_sha256,
        input_hash=job.inputs_sha256,
        output_hash=hashlib.sha256(outputs).digest(),
        started_at=due - 2,
        finished_at=due - 1,
        deadline=due,
        amount=0,
        prev_receipt_hash=b"\x00" * 32,
    )
    receipt = replace(draft, amount=price_receipt(DEFAULT_PLAN, draft))
    request = receipt.request(2 * receipt.amount)
    ack = Ack(
        deal_id=deal_id, task_index=index, request_hash=request.struct_hash(), price=receipt.amount
    )
    domain = world.escrow.domain
    return SignedTask(
        request=request,
        request_sig=request.sign(domain, c),
        ack=ack,
        ack_sig=ack.sign(domain, p),
        receipt=receipt,
    )


class ArbiterProcess:
    """``python -m provider.arbiter.cli run`` on a free port, with its journal in ``data_dir``."""

    def __init__(
        self, world: World, data_dir: Path, extra_env: dict[str, str] | None = None
    ) -> None:
        self.world = world
        self.data_dir = data_dir
        self.extra_env = dict(extra_env or {})
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.process: Any = None

    def start(self) -> None:
        env = {
            **os.environ,
            "JAX_PLATFORMS": "cpu",
            "TPUMARKET_ARBITER_KEY": self.world.arbiter,
            "TPUMARKET_ARBITER_RPC_URL": self.world.anvil.url,
            "TPUMARKET_ARBITER_ESCROW": self.world.escrow.address,
            "TPUMARKET_ARBITER_DATA_DIR": str(self.data_dir),
            "TPUMARKET_ARBITER_PORT": str(self.port),
            "TPUMARKET_ARBITER_EVIDENCE_WINDOW_S": str(EVIDENCE_WINDOW_S),
            "TPUMARKET_ARBITER_RULING_MARGIN_S": "60",
            "TPUMARKET_ARBITER_POLL_INTERVAL_S": "0.2",
            **self.extra_env,
        }
        log = (self.data_dir.parent / f"arbiter-{self.port}.log").open("ab")
        self.process = processes.spawn(
            [sys.executable, "-m", "provider.arbiter.cli", "run"],
            cwd=ROOT,
            env=env,
            stdout=log,
            stderr=log,
        )
        wait_until(self._up, 120, "the arbiter's API")

    def _up(self) -> bool:
        assert self.process.poll() is None, "the arbiter exited"
        try:
            return httpx.get(f"{self.url}/v1/info", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    def case(self, deal_id: int, batch_id: int) -> dict[str, Any] | None:
        answer = httpx.get(f"{self.url}/v1/cases/{deal_id}/{batch_id}", timeout=10)
        return answer.json() if answer.status_code == 200 else None

    def ruling(self, deal_id: int, batch_id: int) -> dict[str, Any] | None:
        answer = httpx.get(f"{self.url}/v1/rulings/{deal_id}/{batch_id}", timeout=10)
        if answer.status_code != 200:
            return None
        body = answer.json()
        assert isinstance(body, dict)
        return body if body["state"] == "done" else None

    def kill(self) -> None:
        processes.kill(self.process)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            processes.stop(self.process)


def dispute(
    world: World, arbiter: ArbiterProcess, job: Job, outputs: bytes, *, provider_index: int = 0
) -> tuple[int, SignedTask]:
    """Open a deal, claim one delivered task with ``outputs`` receipted, dispute the claim."""
    client, provider = world.clients[0], world.providers[provider_index]
    deal_id, _ = open_deal(world, client, provider, penalty=PENALTY)
    task = signed_delivery(world, deal_id, 0, job, outputs, client, provider)
    claim(world, provider, deal_id, [task])
    world.escrow.dispute_claim(client, deal_id, 0)
    wait_until(lambda: arbiter.case(deal_id, 0) is not None, 60, "the arbiter taking the case")
    return deal_id, task


def send(
    world: World, arbiter: ArbiterProcess, deal_id: int, role: Role, body: bytes, key: str
) -> None:
    """Hand one side's evidence of task 0 of batch 0 over, signed with ``key``."""
    upload_evidence(
        arbiter.url,
        world.escrow.domain,
        key,
        deal_id=deal_id,
        batch_id=0,
        task_index=0,
        role=role,
        body=body,
    )


def conserved(world: World) -> bool:
    """Whether the escrow's tokens equal what it owes, to the unit."""
    escrow = world.escrow
    owed = sum(
        escrow.balance_of(address_of(k)) + escrow.stake_of(address_of(k)) for k in world.anvil.keys
    )
    for deal_id in range(1, escrow.deal_count() + 1):
        deal = escrow.get_deal(deal_id)
        owed += deal.max_spend - deal.committed + deal.stake
        owed += escrow.deal_arbiter_fee(deal_id)[1]  # the client's fees held by open disputes
    return bool(world.token.balance_of(escrow.address) == owed)


def ruled(world: World, arbiter: ArbiterProcess, deal_id: int) -> dict[str, Any]:
    """Wait for the ruling on chain; check its document against the transaction; return it."""
    wait_until(lambda: arbiter.ruling(deal_id, 0) is not None, 180, "the ruling on chain")
    answer = arbiter.ruling(deal_id, 0)
    assert answer is not None
    # The served document is the one whose hash the ruling transaction carries.
    tx = world.escrow.tx.w3.eth.get_transaction(answer["tx_hash"])
    assert bytes(tx["input"])[-32:].hex() == answer["document_keccak256"].removeprefix("0x")
    assert conserved(world)
    ruling: dict[str, Any] = answer["ruling"]
    return ruling
