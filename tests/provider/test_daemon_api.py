"""The daemon's task API over the real app: real anvil, real escrow, real sandbox workers."""

from __future__ import annotations

import base64
import hashlib
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient

from contracts.access import (
    ACCESS_EXPIRY_HEADER,
    ACCESS_SIGNATURE_HEADER,
    ACCESS_TOKEN_HEADER,
    result_access_digest,
)
from contracts.binding import DEAL_CLOSED, TASK_VOUCHED
from contracts.messages import (
    ZERO_HASH,
    Ack,
    Domain,
    Receipt,
    Voucher,
    address_of,
    sign_digest,
    task_bitmap,
    verify,
)
from contracts.pricing import price_receipt
from contracts.typed_data import schema
from programs.envelope import (
    ArrayFormat,
    ProgramEnvelope,
    compile_input_hash,
    decode_arrays,
    encode_arrays,
)
from provider.api import create_app
from provider.config import SettlementConfig
from provider.daemon import Daemon
from provider.diagnosis import Category
from provider.errors import ConfigError
from provider.receipts import settle_by
from provider.sandbox import Sandbox
from tests.provider.access_support import deal_access
from tests.provider.daemon_support import (
    CHALLENGE_WINDOW,
    PLAN,
    ChainWorld,
    SignedTask,
    compile_task,
    provider_config,
    sign_task,
    tiny_mlp_envelope,
)


@pytest.fixture(scope="module")
def mlp_task() -> tuple[ProgramEnvelope, np.ndarray[Any, Any]]:
    return tiny_mlp_envelope()


def submit(api: TestClient, task: SignedTask, wait: float = 0.0) -> Any:
    return api.post("/v1/tasks", content=task.body, headers=task.headers(), params={"wait": wait})


def access(
    world: ChainWorld, deal_id: int, index: int, *, key: str | None = None
) -> dict[str, str]:
    """Return headers proving (by a fresh signature) that the caller is the deal's client."""
    expiry = int(time.time()) + 300
    digest = result_access_digest(world.domain, deal_id, index, expiry)
    return {
        ACCESS_EXPIRY_HEADER: str(expiry),
        ACCESS_SIGNATURE_HEADER: "0x" + sign_digest(digest, key or world.client).hex(),
    }


def delivered(api: TestClient, world: ChainWorld, deal_id: int, index: int) -> dict[str, Any]:
    reply = api.get(
        f"/v1/tasks/{deal_id}/{index}", params={"wait": 60}, headers=access(world, deal_id, index)
    )
    assert reply.status_code == 200, reply.text
    body: dict[str, Any] = reply.json()
    assert body["state"] in ("succeeded", "failed"), body
    return body


def receipt_of(body: dict[str, Any], domain: Domain, provider: str) -> Receipt:
    receipt = Receipt.from_json(body["receipt"])
    signature = bytes.fromhex(body["receipt_signature"].removeprefix("0x"))
    return verify(receipt, domain, signature, address_of(provider))


def run_tasks(
    api: TestClient, world: ChainWorld, deal_id: int, envelope: ProgramEnvelope, count: int
) -> list[Receipt]:
    receipts = []
    for index in range(count):
        task = sign_task(world, world.client, deal_id, index, envelope)
        assert submit(api, task).status_code == 200
        receipts.append(
            receipt_of(delivered(api, world, deal_id, index), world.domain, world.provider)
        )
    return receipts


def voucher_json(world: ChainWorld, deal_id: int, amount: int, tasks: list[int]) -> dict[str, Any]:
    voucher = Voucher(deal_id=deal_id, cumulative_amount=amount, tasks=task_bitmap(tasks))
    return {
        "voucher": voucher.to_json(),
        "signature": "0x" + voucher.sign(world.domain, world.client).hex(),
    }


# ---- happy path --------------------------------------------------------------------------


def test_inference_task_when_signed_by_client_then_acked_run_and_receipt_verifies(
    api: TestClient, chain_world: ChainWorld, mlp_task: tuple[ProgramEnvelope, Any]
) -> None:
    world = chain_world
    envelope, expected = mlp_task
    deal_id = world.open_deal()
    task = sign_task(world, world.client, deal_id, 0, envelope)

    reply = submit(api, task)

    assert reply.status_code == 200, reply.text
    body = reply.json()
    assert body["created"] is True
    ack = verify(
        Ack.from_json(body["ack"]),
        world.domain,
        bytes.fromhex(body["ack_signature"][2:]),
        address_of(world.provider),
    )
    assert ack.request_hash == task.request.struct_hash()
    assert ack.price == PLAN.inference_price
    assert "deadline" not in body["ack"]  # the ack commits to the request's deadline

    result = delivered(api, world, deal_id, 0)
    receipt = receipt_of(result, world.domain, world.provider)
    outputs = base64.b64decode(result["outputs_b64"])
    assert result["state"] == "succeeded"
    assert receipt.status == 0
    assert receipt.output_hash == hashlib.sha256(outputs).digest()
    assert receipt.program_hash == task.request.program_hash
    assert receipt.input_hash == task.request.input_hash
    assert receipt.amount == price_receipt(PLAN, receipt) == 500
    assert receipt.amount == world.escrow.price(
        PLAN,
        kind=receipt.kind,
        status=receipt.status,
        cache_hit=receipt.cache_hit,
        device_ms=receipt.device_ms,
        task_index=receipt.task_index,
    )
    assert receipt.prev_receipt_hash == ZERO_HASH
    assert receipt.deadline == task.request.deadline >= receipt.finished_at >= receipt.started_at
    np.testing.assert_allclose(
        decode_arrays(outputs, ArrayFormat.SAFETENSORS)["0"], expected, rtol=1e-5, atol=1e-5
    )
    raw = api.get(
        f"/v1/tasks/{deal_id}/0/outputs", headers={ACCESS_TOKEN_HEADER: body["access_token"]}
    )
    assert raw.content == outputs

    second = sign_task(world, world.client, deal_id, 1, envelope)
    assert submit(api, second, wait=60).json()["state"] == "succeeded"
    chained = receipt_of(delivered(api, world, deal_id, 1), world.domain, world.provider)
    assert chained.prev_receipt_hash == receipt.struct_hash()


def test_compile_task_when_target_bound_then_report_and_mismatch_rejected(
    api: TestClient, chain_world: ChainWorld
) -> None:
    world = chain_world
    envelope, _ = tiny_mlp_envelope(platforms=("cpu", "tpu"))
    deal_id = world.open_deal()
    task = compile_task(world, world.client, deal_id, 0, envelope, "v5e:1x1")
    assert task.request.input_hash == compile_input_hash("v5e:1x1", envelope.inputs_sha256)

    relabelled = replace(task, target="local")
    refused = submit(api, relabelled)
    assert refused.status_code == 422
    assert refused.json()["error"] == "hash_mismatch"

    body = submit(api, task, wait=60).json()
    assert body["state"] == "succeeded", body
    receipt = receipt_of(body, world.domain, world.provider)
    assert body["report"]["device_kind"] == "TPU v5 lite"
    assert body["report"]["memory_total_bytes"] > 0
    assert receipt.kind == 0 and receipt.amount == PLAN.compile_price
    assert receipt.device_ms == 0 and receipt.compile_ms >= 0
    assert receipt.output_hash == hashlib.sha256(base64.b64decode(body["outputs_b64"])).digest()


def test_failed_task_when_program_is_garbage_then_receipt_carries_the_diagnosis(
    api: TestClient, chain_world: ChainWorld, mlp_task: tuple[ProgramEnvelope, Any]
) -> None:
    world = chain_world
    good, _ = mlp_task
    garbage = ProgramEnvelope.create(
        program=b"definitely not a flatbuffer",
        inputs=good.inputs,
        producer=good.producer,
        platforms=good.platforms,
    )
    deal_id = world.open_deal()
    body = submit(api, sign_task(world, world.client, deal_id, 0, garbage), 60).json()

    assert body["state"] == "failed"
    receipt = receipt_of(body, world.domain, world.provider)
    assert body["diagnosis"]["category"] == Category.MALFORMED_INPUT.value
    assert receipt.status == Category.MALFORMED_INPUT.code
    assert body["diagnosis"]["hints"] and body["diagnosis"]["message"]
    assert receipt.amount == price_receipt(PLAN, receipt)


# ---- idempotency -------------------------------------------------------------------------


def test_resubmission_when_same_signed_request_then_same_ack_and_runs_once(
    api: TestClient, chain_world: ChainWorld, daemon: Daemon, mlp_task: tuple[ProgramEnvelope, Any]
) -> None:
    world = chain_world
    envelope, _ = mlp_task
    deal_id = world.open_deal()
    task = sign_task(world, world.client, deal_id, 0, envelope)
    first = submit(api, task).json()
    retry_in_flight = submit(api, task).json()
    result = delivered(api, world, deal_id, 0)
    retry_after = submit(api, task).json()

    assert retry_in_flight["created"] is False and retry_after["created"] is False
    for again in (retry_in_flight, retry_after):
        assert again["ack"] == first["ack"]
        assert again["ack_signature"] == first["ack_signature"]
    assert "receipt" not in retry_after and "access_token" not in retry_after  # the ack only
    assert result["receipt"] is not None
    book = daemon.journal.deal(deal_id)
    assert book is not None and len(book.receipts) == 1 and len(book.acks) == 1

    other = sign_task(world, world.client, deal_id, 0, envelope, max_price=9_999)
    conflict = submit(api, other)
    assert conflict.status_code == 409
    assert conflict.json()["error"] == "task_index_used"


# ---- refusals ----------------------------------------------------------------------------


def test_forged_signature_when_not_the_deals_client_then_403_with_reason(
    api: TestClient, chain_world: ChainWorld, mlp_task: tuple[ProgramEnvelope, Any]
) -> None:
    world = chain_world
    envelope, _ = mlp_task
    deal_id = world.open_deal()
    forged = sign_task(world, world.other_client, deal_id, 0, envelope)

    reply = submit(api, forged)

    assert reply.status_code == 403
    assert reply.json()["error"] == "signature_invalid"
    assert address_of(world.client) in reply.json()["reason"]


@pytest.mark.parametrize("where", ["other_chain", "other_escrow"])
def test_replayed_signature_when_signed_for_another_domain_then_403(
    api: TestClient,
    chain_world: ChainWorld,
    mlp_task: tuple[ProgramEnvelope, Any],
    where: str,
) -> None:
    world = chain_world
    envelope, _ = mlp_task
    deal_id = world.open_deal()
    domain = (
        replace(world.domain, chain_id=1)
        if where == "other_chain"
        else replace(world.domain, verifying_contract=address_of(world.arbiter))
    )
    replayed = sign_task(world, world.client, deal_id, 0, envelope, domain=domain)

    reply = submit(api, replayed)

    assert reply.status_code == 403
    assert reply.json()["error"] == "signature_invalid"


def test_replayed_signature_when_moved_to_another_deal_then_403(
    api: TestClient, chain_world: ChainWorld, mlp_task: tuple[ProgramEnvelope, Any]
) -> None:
    world = chain_world
    envelope, _ = mlp_task
    first, second = world.open_deal(), world.open_deal()
    task = sign_task(world, world.client, first, 0, envelope)
    moved = replace(task, request=replace(task.request, deal_id=second))

    reply = submit(api, moved)

    assert reply.status_code == 403
    assert reply.json()["error"] == "signature_invalid"


def test_malformed_signature_then_400(
    api: TestClient, chain_world: ChainWorld, mlp_task: tuple[ProgramEnvelope, Any]
) -> None:
    world = chain_world
    task = sign_task(world, world.client, world.open_deal(), 0, mlp_task[0])
    reply = submit(api, replace(task, signature=task.signature[:30]))
    assert reply.status_code == 400
    assert reply.json()["error"] == "bad_request"


def test_deal_of_another_provider_then_403(
    api: TestClient, chain_world: ChainWorld, mlp_task: tuple[ProgramEnvelope, Any]
) -> None:
    world = chain_world
    deal_id = world.open_deal(provider=world.other_provider)
    reply = submit(api, sign_task(world, world.client, deal_id, 0, mlp_task[0]))
    assert reply.status_code == 403
    assert reply.json()["error"] == "deal_not_ours"


def test_unknown_deal_then_404(
    api: TestClient, chain_world: ChainWorld, mlp_task: tuple[ProgramEnvelope, Any]
) -> None:
    world = chain_world
    reply = submit(api, sign_task(world, world.client, 10**6, 0, mlp_task[0]))
    assert reply.status_code == 404
    assert reply.json()["error"] == "deal_not_found"


def test_closed_deal_then_409(
    api: TestClient, chain_world: ChainWorld, mlp_task: tuple[ProgramEnvelope, Any]
) -> None:
    world = chain_world
    deal_id = world.open_deal()
    world.escrow.close_deal(world.client, deal_id)
    world.escrow.close_deal(world.provider, deal_id)
    assert world.escrow.get_deal(deal_id).status == DEAL_CLOSED

    reply = submit(api, sign_task(world, world.client, deal_id, 0, mlp_task[0]))

    assert reply.status_code == 409
    assert reply.json()["error"] == "deal_not_open"


def test_budget_when_acked_unpaid_tasks_fill_the_cap_then_402(
    api: TestClient, chain_world: ChainWorld, mlp_task: tuple[ProgramEnvelope, Any]
) -> None:
    world = chain_world
    envelope, _ = mlp_task
    deal_id = world.open_deal(max_spend=1_000)
    too_dear = sign_task(world, world.client, deal_id, 0, envelope, max_price=1_001)
    refused = submit(api, too_dear)
    assert refused.status_code == 402, refused.text

    for index in (0, 1):
        task = sign_task(world, world.client, deal_id, index, envelope, max_price=500)
        assert submit(api, task).status_code == 200
    third = sign_task(world, world.client, deal_id, 2, envelope, max_price=500)
    reply = submit(api, third)

    assert reply.status_code == 402
    assert reply.json()["error"] == "insufficient_budget"


def test_price_when_plan_charges_more_than_max_price_then_422(
    api: TestClient, chain_world: ChainWorld, mlp_task: tuple[ProgramEnvelope, Any]
) -> None:
    world = chain_world
    task = sign_task(world, world.client, world.open_deal(), 0, mlp_task[0], max_price=499)
    reply = submit(api, task)
    assert reply.status_code == 422
    assert reply.json()["error"] == "price_above_max"


def test_hashes_when_envelope_differs_from_signed_request_then_422(
    api: TestClient, chain_world: ChainWorld, mlp_task: tuple[ProgramEnvelope, Any]
) -> None:
    world = chain_world
    envelope, _ = mlp_task
    other_inputs = ProgramEnvelope.create(
        program=envelope.program,
        inputs=encode_arrays({"4": np.zeros((1, 16), np.float32)}),
        weights=envelope.weights,
        producer=envelope.producer,
        platforms=envelope.platforms,
    )
    task = sign_task(world, world.client, world.open_deal(), 0, envelope)
    swapped = replace(task, body=sign_task(world, world.client, 1, 0, other_inputs).body)

    reply = submit(api, swapped)

    assert reply.status_code == 422
    assert reply.json()["error"] == "hash_mismatch"


# ---- vouchers and settlement ---------------------------------------------------------------


def act_by(daemon: Daemon, world: ChainWorld, deal_id: int, receipts: list[Receipt]) -> int:
    """Return when the daemon must have every one of ``receipts`` on chain (the latest)."""
    deal = world.escrow.get_deal(deal_id)
    latest = max(settle_by(r.deadline, deal.expiry, deal.challenge_window) for r in receipts)
    return int(latest - daemon.config.settlement.margin_s(deal.challenge_window))


def test_voucher_when_valid_then_stored_and_redeemed_at_settle_by_minus_margin(
    api: TestClient,
    chain_world: ChainWorld,
    daemon: Daemon,
    mlp_task: tuple[ProgramEnvelope, Any],
) -> None:
    world = chain_world
    deal_id = world.open_deal()
    receipts = run_tasks(api, world, deal_id, mlp_task[0], 2)
    total = sum(r.amount for r in receipts)
    post = api.post

    underpaid = post("/v1/vouchers", json=voucher_json(world, deal_id, total - 1, [0, 1]))
    assert underpaid.status_code == 422 and underpaid.json()["error"] == "voucher_underpays"
    ahead = post("/v1/vouchers", json=voucher_json(world, deal_id, total + 500, [0, 1, 2]))
    assert ahead.json()["error"] == "voucher_covers_undelivered"
    forged = voucher_json(world, deal_id, total, [0, 1])
    other = Voucher.from_json(forged["voucher"])
    forged["signature"] = "0x" + other.sign(world.domain, world.other_client).hex()
    assert post("/v1/vouchers", json=forged).status_code == 403

    first = post("/v1/vouchers", json=voucher_json(world, deal_id, receipts[0].amount, [0]))
    assert first.status_code == 200 and first.json()["new"] is True
    full = post("/v1/vouchers", json=voucher_json(world, deal_id, total, [0, 1]))
    assert full.status_code == 200 and full.json()["tasks"] == [0, 1]
    dropped = post("/v1/vouchers", json=voucher_json(world, deal_id, total + 1, [0]))
    assert dropped.status_code == 409 and dropped.json()["error"] == "voucher_not_cumulative"
    again = post("/v1/vouchers", json=voucher_json(world, deal_id, total, [0, 1]))
    assert again.status_code == 200 and again.json()["new"] is False

    provider = address_of(world.provider)
    balance = world.escrow.balance_of(provider)
    due = act_by(daemon, world, deal_id, receipts[:1])
    world.advance_to(due - 5)
    assert daemon.jobs.redeem_due(deals=[deal_id]) == []  # the client may vouch on
    world.advance_to(due)

    redeemed = daemon.jobs.redeem_due(deals=[deal_id])

    assert len(redeemed) == 1 and redeemed[0].data["paid"] == str(total)
    assert world.escrow.balance_of(provider) == balance + total
    assert world.escrow.get_deal(deal_id).vouched == total
    assert world.escrow.task_status(deal_id, 1) == TASK_VOUCHED
    assert daemon.jobs.redeem_due(force=True, deals=[deal_id]) == []
    summary = api.get(f"/v1/deals/{deal_id}", headers=deal_access(world, deal_id)).json()
    assert summary["redeemed_amount"] == str(total)


def test_silent_client_when_no_voucher_then_claimed_by_settle_by_and_paid_after_the_window(
    api: TestClient,
    chain_world: ChainWorld,
    daemon: Daemon,
    mlp_task: tuple[ProgramEnvelope, Any],
) -> None:
    world = chain_world
    deal_id = world.open_deal()
    receipts = run_tasks(api, world, deal_id, mlp_task[0], 2)
    total = sum(r.amount for r in receipts)
    provider = address_of(world.provider)
    balance = world.escrow.balance_of(provider)
    assert daemon.jobs.claim_due(deals=[deal_id]) == []  # the client may still vouch

    world.advance_to(act_by(daemon, world, deal_id, receipts))
    claims = daemon.jobs.claim_due(deals=[deal_id])

    assert len(claims) == 1 and claims[0].data["tasks"] == [0, 1]  # one transaction
    assert world.escrow.get_deal(deal_id).pending == total
    assert daemon.jobs.finalize_claims(deals=[deal_id]) == []  # the window is open
    world.anvil.increase_time(CHALLENGE_WINDOW + 1)
    finalized = daemon.jobs.finalize_claims(deals=[deal_id])
    assert len(finalized) == 1
    assert world.escrow.balance_of(provider) == balance + total
    deal = world.escrow.get_deal(deal_id)
    assert deal.pending == 0 and deal.committed == total

    late = api.post("/v1/vouchers", json=voucher_json(world, deal_id, total, [0, 1]))
    assert late.status_code == 422
    assert late.json()["error"] == "voucher_covers_claimed"


def test_watch_when_deal_closed_on_chain_then_recorded(
    api: TestClient,
    chain_world: ChainWorld,
    daemon: Daemon,
    mlp_task: tuple[ProgramEnvelope, Any],
) -> None:
    world = chain_world
    deal_id = world.open_deal()
    receipts = run_tasks(api, world, deal_id, mlp_task[0], 1)
    voucher = voucher_json(world, deal_id, receipts[0].amount, [0])
    assert api.post("/v1/vouchers", json=voucher).status_code == 200
    daemon.jobs.redeem_due(force=True, deals=[deal_id])
    world.escrow.close_deal(world.client, deal_id)
    world.escrow.close_deal(world.provider, deal_id)

    assert deal_id in daemon.jobs.watch_deals()
    assert (
        api.get(f"/v1/deals/{deal_id}", headers=deal_access(world, deal_id)).json()["closed"]
        is True
    )


def test_daemon_when_its_interval_cannot_meet_a_deals_window_then_start_and_tasks_refused(
    chain_world: ChainWorld, sandbox: Sandbox, tmp_path: Path, mlp_task: tuple[ProgramEnvelope, Any]
) -> None:
    world = chain_world
    deal_id = world.open_deal(window=CHALLENGE_WINDOW)
    slow = SettlementConfig(interval_s=50, tx_allowance_s=10)  # needs windows of 120 s
    node = Daemon(
        provider_config(world, tmp_path, settlement=slow), chain=world.chain, sandbox=sandbox
    )
    try:
        with pytest.raises(ConfigError, match=f"deal {deal_id}: a challenge window of 60 s"):
            node.start(schedule=False)
        with TestClient(create_app(node)) as client:
            task = sign_task(world, world.client, deal_id, 0, mlp_task[0])
            reply = submit(client, task)
        assert reply.status_code == 409
        assert reply.json()["error"] == "window_too_short"
        assert "interval_s to at most 20 s" in reply.json()["reason"]
    finally:
        node.close()


# ---- system --------------------------------------------------------------------------------


def test_info_and_metrics_when_tasks_ran_then_exposed(
    api: TestClient, chain_world: ChainWorld
) -> None:
    info = api.get("/v1/info").json()
    assert bytes.fromhex(info["plan_hash"][2:]) == chain_world.escrow.plan_hash(PLAN)
    assert info["provider"] == address_of(chain_world.provider)
    assert info["protocol"] == "2"
    assert info["settlement"]["min_challenge_window_s"] == 30
    metrics = api.get("/metrics").text
    assert "tpumarket_provider_tasks_acked_total" in metrics
    assert 'tpumarket_provider_tasks_rejected_total{reason="signature_invalid"}' in metrics
    assert api.get("/v1/health").json()["ok"] is True


def test_typed_data_when_fetched_then_the_escrows_schema_of_every_signed_message(
    api: TestClient, chain_world: ChainWorld
) -> None:
    served = api.get("/v1/typed-data").json()
    assert served == schema(chain_world.domain)
    assert served["domain"]["version"] == "2"
    assert served["domain"]["verifyingContract"] == chain_world.escrow.address
    assert [f["name"] for f in served["types"]["TaskRequest"]][-1] == "deadline"
    assert "deadline" not in [f["name"] for f in served["types"]["Ack"]]


def test_journal_when_reopened_then_every_chain_verifies(daemon: Daemon) -> None:
    from provider.journal import Journal

    copy = Journal(daemon.journal.path, daemon.address, daemon.domain)
    try:
        assert copy.verify() == sum(len(b.receipts) for _, b in daemon.journal.iter_books())
    finally:
        copy.close()


# ---- result access -------------------------------------------------------------------------


def test_result_get_when_no_proof_then_401_and_other_signer_or_token_then_403(
    api: TestClient, chain_world: ChainWorld, mlp_task: tuple[ProgramEnvelope, Any]
) -> None:
    world = chain_world
    deal_id = world.open_deal()
    answer = submit(api, sign_task(world, world.client, deal_id, 0, mlp_task[0]), 60)
    token = answer.json()["access_token"]
    path = f"/v1/tasks/{deal_id}/0"

    anonymous = api.get(path)
    stranger = api.get(path, headers=access(world, deal_id, 0, key=world.other_client))
    other_task = api.get(path, headers={ACCESS_TOKEN_HEADER: answer_token_of(api, world)})
    expired = api.get(
        path,
        headers={
            **access(world, deal_id, 0),
            ACCESS_EXPIRY_HEADER: str(int(time.time()) - 1),
        },
    )
    outputs = api.get(f"{path}/outputs")

    assert anonymous.status_code == 401 and anonymous.json()["error"] == "access_required"
    assert stranger.status_code == 403 and "client is" in stranger.json()["reason"]
    assert other_task.status_code == 403 and other_task.json()["error"] == "access_denied"
    assert expired.status_code == 403
    assert outputs.status_code == 401
    assert api.get(path, headers={ACCESS_TOKEN_HEADER: token}).json()["state"] == "succeeded"
    assert api.get(path, headers=access(world, deal_id, 0)).json().get("access_token") is None


def answer_token_of(api: TestClient, world: ChainWorld) -> str:
    """Return a valid access token of another deal's task."""
    deal_id = world.open_deal()
    task = sign_task(world, world.client, deal_id, 0, tiny_mlp_envelope()[0])
    token: str = submit(api, task).json()["access_token"]
    return token
