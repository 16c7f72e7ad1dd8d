"""A settled task's state stays readable once its outputs are released (pruned).

The daemon (real sandbox, anvil, its API on a real socket) delivers a task, the client
vouches for it and agrees to close the deal, and the daemon's close job redeems the voucher
on chain, which prunes the task's data. Its ``GET`` still answers 200 with the state, the
signed receipt and ``outputs_released_after_settlement``; its outputs are ``410
outputs_pruned``, and the client SDK says so in one line.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator

import httpx
import pytest
import uvicorn

from client.errors import ProviderRejected
from client.provider_http import ProviderHttp
from contracts.chain import free_port
from contracts.messages import Receipt, Voucher, task_bitmap
from provider.api import create_app
from provider.daemon import Daemon
from tests.polling import wait_until
from tests.provider.access_support import proof
from tests.provider.daemon_support import ChainWorld, sign_task, tiny_mlp_envelope


@pytest.fixture(scope="module")
def served(daemon: Daemon) -> Iterator[str]:
    """The module's daemon behind its API app on a real socket; yield its URL."""
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(create_app(daemon), host="127.0.0.1", port=port, log_config=None)
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    wait_until(lambda: server.started, 60, "the API server listening")
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(30)


def test_settled_task_when_its_outputs_are_pruned_then_its_state_stays_readable(
    chain_world: ChainWorld, daemon: Daemon, served: str
) -> None:
    world = chain_world
    deal_id = world.open_deal()
    task = sign_task(world, world.client, deal_id, 0, tiny_mlp_envelope()[0])
    sdk = ProviderHttp(served, client_key=world.client)
    try:
        delivered = sdk.submit(task.request, task.signature, task.body, wait_s=60)
        assert delivered.state == "succeeded" and delivered.outputs, delivered
        assert delivered.receipt is not None
        before = httpx.get(
            f"{served}/v1/tasks/{deal_id}/0", headers=proof(world, world.client, deal_id, 0)
        ).json()
        assert before["outputs_released_after_settlement"] is False
        assert before["outputs_size"] == len(delivered.outputs)

        receipt = delivered.receipt
        voucher = Voucher(deal_id, receipt.amount, task_bitmap([0]))
        assert sdk.send_voucher(voucher, voucher.sign(world.domain, world.client))
        world.escrow.close_deal(world.client, deal_id)  # CloseAgreed by the client
        daemon.jobs.close_deals([deal_id])  # redeems the voucher on chain: task 0 is settled
        wait_until(lambda: daemon.journal.is_pruned((deal_id, 0)), 60, "task 0 pruned")

        answer = httpx.get(
            f"{served}/v1/tasks/{deal_id}/0", headers=proof(world, world.client, deal_id, 0)
        )
        assert answer.status_code == 200, answer.text
        body = answer.json()
        assert body["state"] == "succeeded"
        assert body["outputs_released_after_settlement"] is True
        assert body["outputs_b64"] is None and body["outputs_size"] is None
        assert Receipt.from_json(body["receipt"]) == receipt
        assert body["receipt_signature"] == "0x" + delivered.receipt_signature.hex()

        outputs = httpx.get(
            f"{served}/v1/tasks/{deal_id}/0/outputs",
            headers=proof(world, world.client, deal_id, 0),
        )
        assert outputs.status_code == 410 and outputs.json()["error"] == "outputs_pruned"

        # a fresh SDK (as after a restart) asking for the results: one typed, one-line refusal
        fresh = ProviderHttp(served, client_key=world.client)
        try:
            with pytest.raises(ProviderRejected) as refused:
                fresh.fetch(deal_id, 0)
        finally:
            fresh.close()
        assert refused.value.status == 410 and refused.value.error == "outputs_pruned"
        assert "\n" not in str(refused.value) and "settled on chain" in str(refused.value)
    finally:
        sdk.close()
