"""``kill -9`` of the daemon process, then a restart: nothing acked is lost, everything is paid."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from contracts.binding import TASK_CLAIMED, TASK_NONE
from contracts.chain import free_port
from contracts.messages import ZERO_HASH, Ack, Receipt, address_of, verify
from contracts.reverts import EscrowTaskAlreadySettled
from provider.journal import Journal
from provider.receipts import settle_by
from tests import processes
from tests.provider.access_support import deal_access
from tests.provider.daemon_support import (
    LEAN_SANDBOX_TOML,
    PLAN,
    SLO_S,
    ChainWorld,
    SignedTask,
    sign_task,
    spin_envelope,
    tiny_mlp_envelope,
    wait_until,
)

REPO = Path(__file__).resolve().parents[2]
SLOW_STEPS = 150_000_000  # a few seconds of device time: the kill lands while it runs


class DaemonProcess:
    """The daemon run as its own process through the CLI, the way an operator runs it."""

    def __init__(self, config: Path, world: ChainWorld, log: Path) -> None:
        self.config = config
        self.world = world
        self.log = log
        self.process: subprocess.Popen[bytes] | None = None

    def start(self, port: int, *, jobs: bool = False) -> str:
        env = dict(os.environ, TPUMARKET_PROVIDER_PRIVATE_KEY=self.world.provider)
        env["JAX_PLATFORMS"] = "cpu"
        with self.log.open("ab") as log:
            self.process = processes.spawn(
                [
                    *(sys.executable, "-m", "provider.cli", "run"),
                    *("--config", str(self.config), "--port", str(port)),
                    *(() if jobs else ("--no-jobs",)),
                ],
                cwd=REPO,
                env=env,
                stdout=log,
                stderr=log,
            )
        url = f"http://127.0.0.1:{port}"
        wait_until(lambda: self._healthy(url), 120, "daemon health")
        return url

    def _healthy(self, url: str) -> bool:
        assert self.process is not None
        if self.process.poll() is not None:
            raise AssertionError(f"daemon exited: {self.log.read_text()[-3000:]}")
        try:
            return httpx.get(f"{url}/v1/health", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    def kill9(self) -> None:
        assert self.process is not None
        os.kill(self.process.pid, signal.SIGKILL)
        self.process.wait(30)

    def stop(self) -> None:
        if self.process is not None:
            processes.stop(self.process, grace_s=60)


@pytest.fixture
def daemon_process(chain_world: ChainWorld, tmp_path: Path) -> Iterator[DaemonProcess]:
    config = tmp_path / "provider.toml"
    config.write_text(
        f'rpc_url = "{chain_world.anvil.url}"\n'
        f'escrow = "{chain_world.escrow.address}"\n'
        f'data_dir = "{tmp_path / "data"}"\n'
        'jax_platforms = "cpu"\n'
        f"slo_ms = {SLO_S * 1000}\n"
        "benchmark_on_start = false\n"
        f"{LEAN_SANDBOX_TOML}"
        "[plan]\n"
        f"compile_price = {PLAN.compile_price}\n"
        f"inference_price = {PLAN.inference_price}\n"
        "[settlement]\n"
        "interval_s = 1\n"
        "redeem_threshold = 1000000000\n"
    )
    node = DaemonProcess(config, chain_world, tmp_path / "daemon.log")
    try:
        yield node
    finally:
        node.stop()
        chain_world.chain.tx.reset_nonces()  # the daemon process sent with the same key


def post(url: str, task: SignedTask, wait: float = 0) -> dict[str, Any]:
    reply = httpx.post(
        f"{url}/v1/tasks",
        content=task.body,
        headers=task.headers(),
        params={"wait": wait},
        timeout=wait + 30,
    )
    assert reply.status_code == 200, reply.text
    body: dict[str, Any] = reply.json()
    return body


def test_kill9_mid_task_then_restart_serves_results_reruns_acked_and_keeps_the_chain(
    chain_world: ChainWorld, daemon_process: DaemonProcess, tmp_path: Path
) -> None:
    world = chain_world
    deal_id = world.open_deal()
    url = daemon_process.start(free_port())
    fast = sign_task(world, world.client, deal_id, 0, tiny_mlp_envelope()[0])
    slow = sign_task(world, world.client, deal_id, 1, spin_envelope(SLOW_STEPS))

    done = post(url, fast, wait=60)
    acked = post(url, slow)
    assert done["state"] == "succeeded" and acked["state"] == "acked"
    daemon_process.kill9()  # the slow task is running in the sandbox right now

    url = daemon_process.start(free_port())
    # access tokens survive the restart: they derive from the provider's key
    served = httpx.get(
        f"{url}/v1/tasks/{deal_id}/0",
        headers={"X-Tpumarket-Access": done["access_token"]},
        timeout=30,
    ).json()
    rerun = httpx.get(
        f"{url}/v1/tasks/{deal_id}/1",
        params={"wait": 60},
        headers={"X-Tpumarket-Access": acked["access_token"]},
        timeout=90,
    ).json()
    retried = post(url, slow)

    assert served["receipt"] == done["receipt"]
    assert served["receipt_signature"] == done["receipt_signature"]
    assert served["outputs_b64"] == done["outputs_b64"]
    assert rerun["state"] == "succeeded", rerun.get("diagnosis")
    assert rerun["ack"] == acked["ack"] and rerun["ack_signature"] == acked["ack_signature"]
    # A repeat of the request is answered with its ack alone (anyone can replay a request
    # from a claim's calldata): the result is read with the access proof, as above.
    assert retried["created"] is False and retried["ack"] == rerun["ack"]
    assert "receipt" not in retried and "access_token" not in retried
    provider = address_of(world.provider)
    first = Receipt.from_json(done["receipt"])
    second = verify(
        Receipt.from_json(rerun["receipt"]),
        world.domain,
        bytes.fromhex(rerun["receipt_signature"][2:]),
        provider,
    )
    assert first.prev_receipt_hash == ZERO_HASH
    assert second.prev_receipt_hash == first.struct_hash()
    reply = httpx.get(f"{url}/v1/deals/{deal_id}", headers=deal_access(world, deal_id), timeout=30)
    summary = reply.json()
    assert summary["acked"] == 2 and summary["delivered"] == 2
    assert summary["receipted_amount"] == str(first.amount + second.amount)

    journal = Journal(tmp_path / "data" / "journal.sqlite3", provider, world.domain)
    try:
        assert journal.verify() == 2
        book = journal.deal(deal_id)
        assert book is not None and sorted(book.receipts) == [0, 1]
    finally:
        journal.close()


def test_daemon_killed_after_delivery_and_restarted_inside_the_margin_then_paid_for_everything(
    chain_world: ChainWorld, daemon_process: DaemonProcess
) -> None:
    world = chain_world
    window = 300  # margin 150 s: the restart below lands 140 s before settleBy
    deal_id = world.open_deal(window=window)
    envelope = tiny_mlp_envelope()[0]
    url = daemon_process.start(free_port(), jobs=True)
    tasks = [sign_task(world, world.client, deal_id, i, envelope) for i in range(3)]
    answers = [post(url, task, wait=60) for task in tasks]
    daemon_process.kill9()  # delivered, not vouched, nothing on chain yet
    assert [world.escrow.task_status(deal_id, i) for i in range(3)] == [TASK_NONE] * 3
    deal = world.escrow.get_deal(deal_id)
    last = max(settle_by(t.request.deadline, deal.expiry, window) for t in tasks)
    first = min(settle_by(t.request.deadline, deal.expiry, window) for t in tasks)
    world.advance_to(last - window // 2 + 10)  # past settleBy - margin: due while it was down

    daemon_process.start(free_port(), jobs=True)  # settles what is due at once

    wait_until(
        lambda: all(world.escrow.task_status(deal_id, i) == TASK_CLAIMED for i in range(3)),
        120,
        "the restarted daemon's claims",
    )
    assert world.chain_time() <= first  # claimed before any settleBy
    world.advance_to(first + 1)
    ack = Ack.from_json(answers[0]["ack"])
    with pytest.raises(EscrowTaskAlreadySettled):  # the client's refund comes too late
        world.escrow.refund_breach(
            world.client, tasks[0].request, ack, bytes.fromhex(answers[0]["ack_signature"][2:])
        )
    world.advance_to(last + window + 1)  # past every claim's challenge window
    wait_until(lambda: world.escrow.get_deal(deal_id).pending == 0, 60, "finalized claims")
    earned = sum(Receipt.from_json(a["receipt"]).amount for a in answers)
    assert world.escrow.get_deal(deal_id).committed == earned  # paid to the provider's balance
