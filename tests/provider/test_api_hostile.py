"""The daemon's API against an attacker on the network: no data for the wrong party, and no
request that crashes it or holds its event loop (real anvil, escrow, sandbox and app)."""

from __future__ import annotations

import json
import logging
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from fastapi.testclient import TestClient

from contracts.access import (
    ACCESS_EXPIRY_HEADER,
    ACCESS_SIGNATURE_HEADER,
    ACCESS_TOKEN_HEADER,
)
from contracts.messages import Voucher, task_bitmap
from provider.access import DEAL_SCOPE
from provider.api.fast import MAX_SMALL_BODY_BYTES
from provider.daemon import Daemon
from services.serving import RECURSION_LIMIT
from tests.provider.access_support import proof
from tests.provider.daemon_support import ChainWorld, SignedTask, sign_task, tiny_mlp_envelope

ZERO_SIGNATURE = "0x" + "00" * 65


def submit(api: TestClient, task: SignedTask, signature: str | None = None, wait: float = 0) -> Any:
    headers = task.headers()
    if signature is not None:
        headers["X-Tpumarket-Signature"] = signature
    return api.post("/v1/tasks", content=task.body, headers=headers, params={"wait": wait})


def voucher_body(world: ChainWorld, key: str, deal_id: int, amount: int, tasks: list[int]) -> Any:
    voucher = Voucher(deal_id=deal_id, cumulative_amount=amount, tasks=task_bitmap(tasks))
    return {"voucher": voucher.to_json(), "signature": "0x" + voucher.sign(world.domain, key).hex()}


@dataclass(frozen=True)
class Delivered:
    """A deal with one delivered task and what its answer revealed to its client."""

    deal_id: int
    client: str
    task: SignedTask
    answer: dict[str, Any]

    def secrets(self) -> list[str]:
        """Return the strings only the deal's parties may ever see."""
        answer = self.answer
        found = [
            answer["access_token"],
            answer["ack_signature"].removeprefix("0x"),
            answer["receipt_signature"].removeprefix("0x"),
            answer["receipt_hash"].removeprefix("0x"),
        ]
        return found + ([answer["outputs_b64"][:40]] if answer.get("outputs_b64") else [])


def deliver(api: TestClient, world: ChainWorld, client: str) -> Delivered:
    deal_id = world.open_deal(client=client)
    task = sign_task(world, client, deal_id, 0, tiny_mlp_envelope()[0])
    reply = submit(api, task, wait=60)
    assert reply.status_code == 200, reply.text
    assert reply.json()["state"] == "succeeded"
    return Delivered(deal_id, client, task, reply.json())


@pytest.fixture(scope="module")
def victim(api: TestClient, chain_world: ChainWorld) -> Delivered:
    """The deal whose data an attacker is after (client: ``world.client``)."""
    return deliver(api, chain_world, chain_world.client)


@pytest.fixture(scope="module")
def attacker(api: TestClient, chain_world: ChainWorld) -> Delivered:
    """A deal of another client, whose credentials the attacker holds."""
    return deliver(api, chain_world, chain_world.other_client)


# ---- results only for the right party ------------------------------------------------------


def test_replayed_request_when_signature_is_zero_garbage_or_foreign_then_no_ack_nor_result(
    api: TestClient,
    chain_world: ChainWorld,
    daemon: Daemon,
    victim: Delivered,
    attacker: Delivered,
    caplog: pytest.LogCaptureFixture,
) -> None:
    world = chain_world
    foreign = "0x" + victim.task.request.sign(world.domain, world.other_client).hex()
    replayed = "0x" + attacker.task.signature.hex()
    garbage = "0x" + "ab" * 65
    caplog.set_level(logging.INFO, logger="provider.service")

    answers = [
        submit(api, victim.task, sig) for sig in (ZERO_SIGNATURE, garbage, foreign, replayed)
    ]

    for reply in answers:
        assert reply.status_code in (400, 403), reply.text
        assert reply.json()["error"] in ("signature_invalid", "bad_request")
        assert all(secret not in reply.text for secret in victim.secrets())
    assert sum("task rejected" in r.getMessage() for r in caplog.records) >= len(answers)
    book = daemon.journal.deal(victim.deal_id)
    assert book is not None and len(book.acks) == 1
    again = submit(api, victim.task)  # the client's own repeat still gets its ack, no more
    assert again.status_code == 200 and again.json()["ack"] == victim.answer["ack"]
    assert "access_token" not in again.json() and "receipt" not in again.json()


def test_task_index_when_caller_is_not_the_deals_client_then_used_and_unused_answer_alike(
    api: TestClient, chain_world: ChainWorld, victim: Delivered
) -> None:
    world = chain_world
    envelope = tiny_mlp_envelope()[0]
    used = sign_task(world, world.other_client, victim.deal_id, 0, envelope)
    unused = sign_task(world, world.other_client, victim.deal_id, 7, envelope)

    used_reply, unused_reply = submit(api, used), submit(api, unused)
    stranger_reads = [
        api.get(
            f"/v1/tasks/{victim.deal_id}/{index}",
            headers=proof(world, world.other_client, victim.deal_id, index),
        )
        for index in (0, 7)
    ]

    assert used_reply.status_code == unused_reply.status_code == 403
    assert used_reply.json()["error"] == unused_reply.json()["error"] == "signature_invalid"
    assert [r.status_code for r in stranger_reads] == [403, 403]
    assert {r.json()["error"] for r in stranger_reads} == {"access_denied"}


def test_deal_summary_when_client_or_provider_proves_then_200_else_401_or_403(
    api: TestClient, chain_world: ChainWorld, victim: Delivered
) -> None:
    world = chain_world
    path = f"/v1/deals/{victim.deal_id}"

    by_client = api.get(path, headers=proof(world, world.client, victim.deal_id, DEAL_SCOPE))
    by_provider = api.get(path, headers=proof(world, world.provider, victim.deal_id, DEAL_SCOPE))
    anonymous = api.get(path)
    stranger = api.get(path, headers=proof(world, world.other_client, victim.deal_id, DEAL_SCOPE))
    task_proof = api.get(path, headers=proof(world, world.client, victim.deal_id, 0))

    assert by_client.status_code == by_provider.status_code == 200
    assert by_client.json()["delivered"] == 1 and by_provider.json() == by_client.json()
    assert anonymous.status_code == 401
    assert stranger.status_code == 403 and task_proof.status_code == 403


def _credentials(world: ChainWorld, victim: Delivered, attacker: Delivered) -> dict[str, Any]:
    """Every way the attacker can dress up a call about the victim's deal."""
    deal, other = victim.deal_id, attacker.deal_id
    request = victim.task.request
    return {
        "stranger": {"headers": {}, "signature": None},
        "stranger_signature": {
            "headers": proof(world, world.other_client, deal, 0),
            "signature": "0x" + request.sign(world.domain, world.other_client).hex(),
        },
        "other_deal_party": {
            "headers": {ACCESS_TOKEN_HEADER: attacker.answer["access_token"]},
            "signature": "0x" + attacker.task.signature.hex(),
        },
        "other_deal_deal_proof": {
            "headers": proof(world, world.other_client, other, DEAL_SCOPE),
            "signature": ZERO_SIGNATURE,
        },
        "replayed_access_signature": {
            "headers": proof(world, world.other_client, other, 0),
            "signature": "0x" + attacker.task.signature.hex(),
        },
        "zero_signature": {
            "headers": {
                ACCESS_EXPIRY_HEADER: str(int(time.time()) + 60),
                ACCESS_SIGNATURE_HEADER: ZERO_SIGNATURE,
            },
            "signature": ZERO_SIGNATURE,
        },
    }


def test_every_route_when_called_as_stranger_other_party_or_replayed_then_no_data_of_the_deal(
    api: TestClient, chain_world: ChainWorld, victim: Delivered, attacker: Delivered
) -> None:
    world = chain_world
    routes = api.get("/openapi.json").json()["paths"]
    secrets = victim.secrets()
    calls = 0
    for name, credential in _credentials(world, victim, attacker).items():
        for template, methods in routes.items():
            path = template.format(deal_id=victim.deal_id, task_index=0)
            for method in methods:
                headers = dict(credential["headers"])
                if method == "post" and template == "/v1/tasks":
                    task = victim.task
                    headers.update(task.headers())
                    headers["X-Tpumarket-Signature"] = credential["signature"] or ZERO_SIGNATURE
                    reply = api.post(path, content=task.body, headers=headers)
                elif method == "post":
                    body = voucher_body(world, world.other_client, victim.deal_id, 500, [0])
                    if credential["signature"] is not None:
                        body["signature"] = credential["signature"]
                    reply = api.post(path, json=body, headers=headers)
                else:
                    reply = api.request(method.upper(), path, headers=headers)
                calls += 1
                leaked = [s for s in secrets if s in reply.text]
                assert not leaked, f"{name}: {method.upper()} {template} leaked {leaked}"
                if "{deal_id}" in template or method == "post":
                    assert 400 <= reply.status_code < 500, (name, template, reply.text)
    assert calls >= 6 * 8  # every credential on every route of the document


# ---- parsing that cannot be crashed or stalled ---------------------------------------------


def test_recursion_limit_when_the_app_is_built_then_back_to_the_default(api: TestClient) -> None:
    assert sys.getrecursionlimit() == RECURSION_LIMIT


@pytest.mark.parametrize("body", [b"[" * 100_000, b'{"a":' * 30_000, b"[" * 20 + b"]" * 20])
def test_nested_json_when_posted_as_a_voucher_then_4xx_and_the_daemon_keeps_serving(
    api: TestClient, body: bytes
) -> None:
    reply = api.post("/v1/vouchers", content=body, headers={"Content-Type": "application/json"})

    assert 400 <= reply.status_code < 500
    assert len(reply.content) < 1_000
    assert api.get("/v1/health").json()["ok"] is True


def test_nested_json_when_sent_as_the_request_header_then_400(
    api: TestClient, victim: Delivered
) -> None:
    headers = victim.task.headers()
    headers["X-Tpumarket-Request"] = "[" * 30_000

    reply = api.post("/v1/tasks", content=victim.task.body, headers=headers)

    assert reply.status_code == 400 and reply.json()["error"] == "bad_request"
    assert api.get("/v1/health").json()["ok"] is True


def _chunks(total: int, size: int = 16 * 1024) -> Iterator[bytes]:
    sent = 0
    while sent < total:
        yield b" " * min(size, total - sent)
        sent += size


def test_voucher_body_when_above_the_cap_then_413_declared_or_streamed(api: TestClient) -> None:
    json_type = {"Content-Type": "application/json"}
    declared = api.post(
        "/v1/vouchers", content=b" " * (MAX_SMALL_BODY_BYTES + 1), headers=json_type
    )
    streamed = api.post("/v1/vouchers", content=_chunks(200 * 1024 * 1024), headers=json_type)

    assert declared.status_code == 413 and declared.json()["error"] == "body_too_large"
    assert streamed.status_code == 413 and streamed.json()["error"] == "body_too_large"


def test_content_type_when_not_the_routes_then_415(
    api: TestClient, chain_world: ChainWorld, victim: Delivered
) -> None:
    body = voucher_body(chain_world, chain_world.client, victim.deal_id, 500, [0])
    as_form = api.post(
        "/v1/vouchers", content=json.dumps(body), headers={"Content-Type": "text/plain"}
    )
    headers = {**victim.task.headers(), "Content-Type": "application/json"}
    task_as_json = api.post("/v1/tasks", content=victim.task.body, headers=headers)

    assert as_form.status_code == 415 and task_as_json.status_code == 415


def test_out_of_range_numbers_then_4xx_never_500(
    api: TestClient, chain_world: ChainWorld, victim: Delivered
) -> None:
    world = chain_world
    huge = 2**300
    latin = ("é" * 64).encode("latin-1")
    reads = [
        api.get(f"/v1/tasks/{huge}/0"),
        api.get(f"/v1/tasks/{victim.deal_id}/{2**40}"),
        api.get(f"/v1/tasks/{victim.deal_id}/-1/outputs"),
        api.get(f"/v1/deals/{huge}"),
        api.get(f"/v1/deals/{'9' * 5000}"),
        api.get(f"/v1/tasks/{victim.deal_id}/0", params={"wait": "nan"}),
        api.get(
            f"/v1/tasks/{victim.deal_id}/0",
            headers={ACCESS_EXPIRY_HEADER: str(10**40), ACCESS_SIGNATURE_HEADER: ZERO_SIGNATURE},
        ),
        api.get(f"/v1/tasks/{victim.deal_id}/0", headers={ACCESS_TOKEN_HEADER: latin}),
    ]
    request = victim.task.request.to_json()
    bad_requests = []
    for field, value in (("deal_id", huge), ("task_index", 2**33), ("max_price", -1)):
        headers = victim.task.headers()
        headers["X-Tpumarket-Request"] = json.dumps({**request, field: str(value)})
        bad_requests.append(api.post("/v1/tasks", content=victim.task.body, headers=headers))
    voucher = voucher_body(world, world.client, victim.deal_id, 500, [0])
    vouchers = [
        api.post("/v1/vouchers", json={**voucher, "voucher": {**voucher["voucher"], name: value}})
        for name, value in (
            ("cumulative_amount", str(huge)),
            ("deal_id", str(huge)),
            ("tasks", [str(huge)]),
            ("tasks", ["1"] * 300),
        )
    ]

    for number, reply in enumerate(reads + bad_requests + vouchers):
        assert 400 <= reply.status_code < 500, (number, reply.text[:200])
        assert len(reply.content) < 4_000


def test_voucher_when_bitmap_is_the_largest_allowed_then_answered_and_bounded(
    api: TestClient, chain_world: ChainWorld, victim: Delivered
) -> None:
    """256 words of every bit: 65,536 task indexes, signed by the deal's client."""
    world = chain_world
    voucher = Voucher(deal_id=victim.deal_id, cumulative_amount=10**6, tasks=(2**256 - 1,) * 256)
    body = {
        "voucher": voucher.to_json(),
        "signature": "0x" + voucher.sign(world.domain, world.client).hex(),
    }

    reply = api.post("/v1/vouchers", json=body)

    assert len(json.dumps(body)) < MAX_SMALL_BODY_BYTES
    assert reply.status_code == 422 and reply.json()["error"] == "voucher_covers_undelivered"
    assert api.get("/v1/health").json()["ok"] is True


def test_task_upload_when_signed_by_a_stranger_then_refused_before_the_body_is_read(
    api: TestClient, victim: Delivered
) -> None:
    pulled: list[int] = []

    def upload() -> Iterator[bytes]:  # 160 MiB if anyone reads it
        for chunk in range(10_000):
            pulled.append(chunk)
            yield b"\0" * 16_384

    headers = {**victim.task.headers(), "X-Tpumarket-Signature": ZERO_SIGNATURE}
    reply = api.post("/v1/tasks", content=upload(), headers=headers)

    assert reply.status_code == 403 and reply.json()["error"] == "signature_invalid"
    assert pulled == []


def test_api_pages_when_requested_then_none_loads_scripts_from_elsewhere(api: TestClient) -> None:
    assert api.get("/docs").status_code == 404 and api.get("/redoc").status_code == 404
    assert api.get("/openapi.json").json()["info"]["title"] == "tpumarket provider"
