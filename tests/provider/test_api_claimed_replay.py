"""Results only for their owner, even once a claim has published the client's signed requests.

A claim's calldata carries each task's receipt, its ``maxPrice`` and the client's request
signature: anyone with RPC access rebuilds the signed ``TaskRequest``. Here a stranger does
exactly that from a real ``claimReceipts`` transaction on anvil and posts the requests to the
daemon served over real sockets: it gets the ack alone (no outputs, no report, no token, no
waiting), while the real client, with a new SDK instance (as after a crash), still reads
its results with a fresh signature. Access tokens expire and name their task and domain.
"""

from __future__ import annotations

import dataclasses
import json
import threading
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import uvicorn
from fastapi.testclient import TestClient

from client.provider_http import ProviderHttp
from contracts.access import ACCESS_TOKEN_HEADER
from contracts.binding import indexed_topic
from contracts.chain import free_port
from contracts.messages import Domain, Receipt, TaskRequest
from provider.access import TOKEN_TTL_S, ResultAccess
from provider.api import create_app
from provider.daemon import Daemon
from provider.errors import RejectedError
from provider.receipts import settle_by
from tests.polling import wait_until
from tests.provider.daemon_support import (
    ChainWorld,
    compile_task,
    sign_task,
    tiny_mlp_envelope,
)

RESULT_FIELDS = ("receipt", "outputs_b64", "outputs_size", "report", "diagnosis", "access_token")


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


@dataclasses.dataclass(frozen=True)
class Published:
    """A task request and signature as a stranger rebuilds them from a claim's calldata."""

    request: TaskRequest
    signature: bytes


def claimed_requests(world: ChainWorld, deal_id: int) -> list[Published]:
    """Decode every ``claimReceipts`` transaction of ``deal_id`` with the escrow's ABI."""
    escrow = world.escrow
    w3 = escrow.tx.w3
    logs = w3.eth.get_logs(
        {
            "address": escrow.address,
            "fromBlock": 0,
            "toBlock": "latest",
            "topics": [escrow.event_topic("ReceiptsClaimed"), indexed_topic(deal_id)],
        }  # type: ignore[typeddict-item]
    )
    names = [f.name for f in dataclasses.fields(Receipt)]
    found = []
    for log in logs:
        tx = w3.eth.get_transaction(log["transactionHash"])
        function, args = escrow.contract.decode_function_input(tx["input"])
        assert function.fn_name == "claimReceipts"
        for claim in args["claims"]:
            fields = claim["receipt"] if isinstance(claim, dict) else claim[0]
            values = fields if not isinstance(fields, dict) else [fields[_camel(n)] for n in names]
            receipt = Receipt(**{n: _plain(v) for n, v in zip(names, values, strict=True)})
            max_price = claim["maxPrice"] if isinstance(claim, dict) else claim[1]
            signature = claim["requestSignature"] if isinstance(claim, dict) else claim[2]
            found.append(Published(receipt.request(int(max_price)), bytes(signature)))
    return found


def _plain(value: Any) -> Any:
    return bytes(value) if isinstance(value, (bytes, bytearray)) else value


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part.title() for part in rest)


def test_replay_when_rebuilt_from_claim_calldata_then_ack_only_and_the_client_still_reads(
    api: TestClient, served: str, chain_world: ChainWorld, daemon: Daemon
) -> None:
    world = chain_world
    deal_id = world.open_deal()
    envelope = tiny_mlp_envelope()[0]
    tasks = [
        sign_task(world, world.client, deal_id, 0, envelope),
        compile_task(world, world.client, deal_id, 1, envelope, "local"),
    ]
    firsts = []
    for task in tasks:
        reply = api.post(
            "/v1/tasks", content=task.body, headers=task.headers(), params={"wait": 60}
        )
        assert reply.status_code == 200 and reply.json()["state"] == "succeeded", reply.text
        firsts.append(reply.json())
    assert firsts[0]["outputs_b64"] and firsts[1]["report"] and firsts[0]["access_token"]
    deal = world.escrow.get_deal(deal_id)
    latest = max(settle_by(t.request.deadline, deal.expiry, deal.challenge_window) for t in tasks)
    world.advance_to(int(latest - daemon.config.settlement.margin_s(deal.challenge_window)))
    assert daemon.jobs.claim_due(deals=[deal_id])  # the client never vouched: claimed on chain

    published = claimed_requests(world, deal_id)
    assert [p.request for p in published] == [t.request for t in tasks]
    answers = []
    with httpx.Client(base_url=served, timeout=120) as stranger:
        for item in published:
            headers = {
                "X-Tpumarket-Request": json.dumps(item.request.to_json()),
                "X-Tpumarket-Signature": "0x" + item.signature.hex(),
                "Content-Type": "application/octet-stream",
            }
            answers.append(stranger.post("/v1/tasks", headers=headers, params={"wait": 60}))
            key = f"/v1/tasks/{deal_id}/{item.request.task_index}"
            assert stranger.get(key).status_code == 401
            assert stranger.get(key + "/outputs").status_code == 401

    results_read_by_stranger = 0
    for answer, first in zip(answers, firsts, strict=True):
        assert answer.status_code == 200, answer.text
        body = answer.json()
        assert body["created"] is False and body["state"] == "acked"
        assert body["ack"] == first["ack"] and body["ack_signature"] == first["ack_signature"]
        leaked = [name for name in RESULT_FIELDS if body.get(name)]
        results_read_by_stranger += bool(leaked)
        assert leaked == []
        assert first["outputs_b64"][:40] not in answer.text
    assert results_read_by_stranger == 0

    sdk = ProviderHttp(served, client_key=world.client)  # a new process: no token held
    try:
        for task, first in zip(tasks, firsts, strict=True):
            again = sdk.submit(task.request, task.signature, task.body, target=task.target)
            assert again.receipt is None and again.outputs is None  # the resubmission: ack only
            view = sdk.fetch(deal_id, task.request.task_index, wait_s=30)
            assert view.receipt is not None and view.receipt.to_json() == first["receipt"]
            assert view.outputs is not None and view.outputs.hex()
        assert sdk.fetch(deal_id, 1).report == firsts[1]["report"]
    finally:
        sdk.close()


def test_access_token_when_expired_or_for_another_task_or_domain_then_denied(
    daemon: Daemon, chain_world: ChainWorld
) -> None:
    access = daemon.access
    now = 1_900_000_000.0
    token, expiry = access.token((7, 3), now)
    header = ACCESS_TOKEN_HEADER.lower()

    def check(key: tuple[int, int], sent: str, at: float) -> str | None:
        try:
            access.check(key, {header: sent}, client_of=lambda _: "0x0", now=at)
        except RejectedError as exc:
            return exc.code
        return None

    other_chain = Domain(
        chain_id=chain_world.domain.chain_id + 1,
        verifying_contract=chain_world.domain.verifying_contract,
    )
    foreign, _ = ResultAccess(chain_world.provider, other_chain).token((7, 3), now)
    stretched = f"{expiry + 10 * TOKEN_TTL_S}.{token.partition('.')[2]}"

    assert expiry == int(now) + TOKEN_TTL_S
    assert check((7, 3), token, now + TOKEN_TTL_S - 1) is None
    assert check((7, 3), token, now + TOKEN_TTL_S) == "access_denied"  # expired
    assert check((7, 4), token, now) == "access_denied"  # another task
    assert check((8, 3), token, now) == "access_denied"  # another deal
    assert check((7, 3), foreign, now) == "access_denied"  # another chain
    assert check((7, 3), stretched, now) == "access_denied"  # its expiry is signed
    assert check((7, 3), token.partition(".")[2], now) == "access_denied"  # the old form
