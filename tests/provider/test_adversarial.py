"""Attacks on the daemon by its client, each against a real anvil and the real daemon.

The chain's clock is moved with ``evm_setNextBlockTimestamp`` / ``evm_mine`` (``advance_to``),
never by sleeping; the daemon's jobs are triggered by hand right after, as its scheduler would.
"""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient

from contracts.binding import TASK_CLAIMED, TASK_VOUCHED
from contracts.messages import Ack, Receipt, Voucher, address_of, task_bitmap
from contracts.reverts import EscrowTaskAlreadySettled
from provider.daemon import Daemon
from provider.receipts import settle_by
from tests.provider.daemon_support import (
    SLO_S,
    ChainWorld,
    SignedTask,
    sign_task,
    tiny_mlp_envelope,
)


def deliver(api: TestClient, task: SignedTask) -> dict[str, Any]:
    """Submit a task and wait for its result; return the answer."""
    body: dict[str, Any] = api.post(
        "/v1/tasks", content=task.body, headers=task.headers(), params={"wait": 60}
    ).json()
    assert body["state"] == "succeeded", body
    return body


def resubmit(api: TestClient, task: SignedTask) -> dict[str, Any]:
    """Send an acked task again: the answer is its ack alone (anyone could replay the request
    from a claim's calldata, so a repeat never carries the result)."""
    body: dict[str, Any] = api.post("/v1/tasks", content=task.body, headers=task.headers()).json()
    assert body["created"] is False and body["state"] == "acked" and "receipt" not in body, body
    return body


def run_tasks(
    api: TestClient, world: ChainWorld, deal_id: int, indexes: range
) -> tuple[list[SignedTask], list[Receipt]]:
    envelope = tiny_mlp_envelope()[0]
    tasks = [sign_task(world, world.client, deal_id, i, envelope) for i in indexes]
    return tasks, [Receipt.from_json(deliver(api, t)["receipt"]) for t in tasks]


def voucher(world: ChainWorld, deal_id: int, amount: int, tasks: Any) -> dict[str, Any]:
    words = tasks if isinstance(tasks, tuple) else task_bitmap(tasks)
    signed = Voucher(deal_id=deal_id, cumulative_amount=amount, tasks=words)
    return {
        "voucher": signed.to_json(),
        "signature": "0x" + signed.sign(world.domain, world.client).hex(),
    }


def settle_at(world: ChainWorld, deal_id: int, deadline: int) -> int:
    deal = world.escrow.get_deal(deal_id)
    return settle_by(deadline, deal.expiry, deal.challenge_window)


def act_at(daemon: Daemon, world: ChainWorld, deal_id: int, deadline: int) -> int:
    margin = daemon.config.settlement.margin_s(world.escrow.get_deal(deal_id).challenge_window)
    return int(settle_at(world, deal_id, deadline) - margin)


def refund(world: ChainWorld, task: SignedTask, answer: dict[str, Any]) -> None:
    ack = Ack.from_json(answer["ack"])
    signature = bytes.fromhex(answer["ack_signature"][2:])
    world.escrow.refund_breach(world.client, task.request, ack, signature)


def block_time(world: ChainWorld, tx_hash: str) -> int:
    receipt = world.chain.w3.eth.get_transaction_receipt(tx_hash)  # type: ignore[arg-type]
    return int(world.chain.w3.eth.get_block(receipt["blockNumber"])["timestamp"])


def test_client_stops_vouching_after_delivery_then_every_task_is_claimed_before_settle_by_and_paid(
    api: TestClient, chain_world: ChainWorld, daemon: Daemon
) -> None:
    world = chain_world
    deal_id = world.open_deal()
    tasks, receipts = run_tasks(api, world, deal_id, range(3))
    provider = address_of(world.provider)
    balance = world.escrow.balance_of(provider)
    first = min(t.request.deadline for t in tasks)
    last = max(t.request.deadline for t in tasks)

    world.advance_to(act_at(daemon, world, deal_id, first) - 1)
    assert deal_id not in [
        c.deal_id for c in daemon.jobs.run_all([deal_id]).claimed
    ]  # may still vouch
    world.advance_to(act_at(daemon, world, deal_id, last))
    claimed = list(daemon.jobs.run_all([deal_id]).claimed)

    assert sorted(i for c in claimed for i in c.data["tasks"]) == [0, 1, 2]
    for claim in claimed:
        assert claim.tx_hash is not None
        assert block_time(world, claim.tx_hash) <= settle_at(world, deal_id, first)
    world.advance_to(settle_at(world, deal_id, last) + 1)
    with pytest.raises(EscrowTaskAlreadySettled):  # the client's refund comes too late
        refund(world, tasks[0], resubmit(api, tasks[0]))
    world.advance_to(max(int(c.data["deadline"]) for c in claimed))
    finalized = list(daemon.jobs.run_all([deal_id]).finalized)
    assert len(finalized) == len(claimed)
    assert world.escrow.balance_of(provider) == balance + sum(r.amount for r in receipts)


def test_client_refunds_at_settle_by_plus_one_after_a_vouched_delivery_then_the_refund_reverts(
    api: TestClient, chain_world: ChainWorld, daemon: Daemon
) -> None:
    world = chain_world
    deal_id = world.open_deal()
    tasks, receipts = run_tasks(api, world, deal_id, range(1))
    assert api.post("/v1/vouchers", json=voucher(world, deal_id, 500, [0])).status_code == 200
    client, provider = address_of(world.client), address_of(world.provider)
    balances = world.escrow.balance_of(client), world.escrow.balance_of(provider)

    world.advance_to(act_at(daemon, world, deal_id, tasks[0].request.deadline))
    assert deal_id in [r.deal_id for r in daemon.jobs.run_all([deal_id]).redeemed]
    world.advance_to(settle_at(world, deal_id, tasks[0].request.deadline) + 1)

    with pytest.raises(EscrowTaskAlreadySettled):
        refund(world, tasks[0], resubmit(api, tasks[0]))
    assert world.escrow.task_status(deal_id, 0) == TASK_VOUCHED
    assert world.escrow.balance_of(client) == balances[0]
    assert world.escrow.balance_of(provider) == balances[1] + receipts[0].amount


def test_crafted_underpaying_voucher_then_refused_and_the_honest_one_accepted_and_paid(
    api: TestClient, chain_world: ChainWorld, daemon: Daemon
) -> None:
    world = chain_world
    deal_id = world.open_deal()
    tasks, receipts = run_tasks(api, world, deal_id, range(2))
    total = sum(r.amount for r in receipts)

    cheap = api.post("/v1/vouchers", json=voucher(world, deal_id, 1, [0, 1]))
    every_bit = api.post("/v1/vouchers", json=voucher(world, deal_id, 1, (2**256 - 1,) * 256))
    short = api.post("/v1/vouchers", json=voucher(world, deal_id, total - 1, [0, 1]))

    assert cheap.status_code == 422 and cheap.json()["error"] == "voucher_underpays"
    assert "whose receipts sum to 1000" in cheap.json()["reason"]
    assert every_bit.status_code == 422
    assert short.json()["error"] == "voucher_underpays"
    book = daemon.journal.deal(deal_id)
    assert book is not None and book.latest_voucher is None  # nothing stored
    honest = api.post("/v1/vouchers", json=voucher(world, deal_id, total, [0, 1]))
    assert honest.status_code == 200 and honest.json()["new"] is True
    world.advance_to(act_at(daemon, world, deal_id, tasks[0].request.deadline))
    assert deal_id in [r.deal_id for r in daemon.jobs.run_all([deal_id]).redeemed]
    assert world.escrow.get_deal(deal_id).vouched == total


def test_voucher_covering_a_claimed_task_then_refused_and_later_vouchers_without_it_accepted(
    api: TestClient, chain_world: ChainWorld, daemon: Daemon
) -> None:
    world = chain_world
    deal_id = world.open_deal()
    tasks, receipts = run_tasks(api, world, deal_id, range(2))
    world.advance_to(act_at(daemon, world, deal_id, max(t.request.deadline for t in tasks)))
    assert deal_id in [c.deal_id for c in daemon.jobs.run_all([deal_id]).claimed]
    later, more = run_tasks(api, world, deal_id, range(2, 4))
    total = sum(r.amount for r in receipts + more)

    stale = api.post("/v1/vouchers", json=voucher(world, deal_id, total, [0, 1, 2, 3]))

    assert stale.status_code == 422 and stale.json()["error"] == "voucher_covers_claimed"
    assert "task 0 was claimed on chain" in stale.json()["reason"]
    for index in (2, 3):  # the hand-over failed on the client's side: it sends without them
        paid = sum(r.amount for r in more if r.task_index <= index)
        reply = api.post(
            "/v1/vouchers", json=voucher(world, deal_id, paid, list(range(2, index + 1)))
        )
        assert reply.status_code == 200, reply.text
    world.advance_to(act_at(daemon, world, deal_id, later[0].request.deadline))
    report = daemon.jobs.run_all([deal_id])
    assert deal_id in [r.deal_id for r in report.redeemed]
    assert [world.escrow.task_status(deal_id, i) for i in range(4)] == [TASK_CLAIMED] * 2 + [
        TASK_VOUCHED
    ] * 2


def test_request_with_a_deadline_too_soon_then_refused_with_the_reason(
    api: TestClient, chain_world: ChainWorld
) -> None:
    world = chain_world
    deal_id = world.open_deal()
    soon = world.chain_time() + SLO_S - 5  # less than the provider's SLO away
    task = sign_task(world, world.client, deal_id, 0, tiny_mlp_envelope()[0], deadline=soon)

    reply = api.post("/v1/tasks", content=task.body, headers=task.headers())

    assert reply.status_code == 422
    assert reply.json()["error"] == "deadline_too_soon"
    assert f"its SLO of {SLO_S} s" in reply.json()["reason"]
    ok = sign_task(world, world.client, deal_id, 0, tiny_mlp_envelope()[0])
    assert api.post("/v1/tasks", content=ok.body, headers=ok.headers()).status_code == 200


def test_request_with_a_deadline_past_the_deals_expiry_then_refused(
    api: TestClient, chain_world: ChainWorld
) -> None:
    world = chain_world
    deal_id = world.open_deal(duration=600)
    expiry = world.escrow.get_deal(deal_id).expiry
    task = sign_task(world, world.client, deal_id, 0, tiny_mlp_envelope()[0], deadline=expiry + 1)

    reply = api.post("/v1/tasks", content=task.body, headers=task.headers())

    assert reply.status_code == 422
    assert reply.json()["error"] == "deadline_after_expiry"
    assert str(expiry) in reply.json()["reason"]


def test_budget_when_the_client_refunded_a_task_then_it_is_not_counted_twice(
    api: TestClient, chain_world: ChainWorld, daemon: Daemon
) -> None:
    world = chain_world
    deal_id = world.open_deal(max_spend=1_000)
    envelope = tiny_mlp_envelope()[0]
    first = sign_task(world, world.client, deal_id, 0, envelope, max_price=500)
    answer = deliver(api, first)
    # The daemon's jobs did not run (it was down): the client refunds the task after settleBy.
    world.advance_to(settle_at(world, deal_id, first.request.deadline) + 1)
    refund(world, first, answer)
    assert world.escrow.get_deal(deal_id).committed == 500  # the refund left the budget
    daemon.deals.invalidate(deal_id)  # the deal cache's TTL passed

    second = sign_task(world, world.client, deal_id, 1, envelope, max_price=500)
    reply = api.post("/v1/tasks", content=second.body, headers=second.headers())

    assert reply.status_code == 200, reply.text  # 500 left, nothing acked and unpaid
    book = daemon.journal.deal(deal_id)
    assert book is not None and book.refunded_tasks() == {0}
    third = sign_task(world, world.client, deal_id, 2, envelope, max_price=500)
    refused = api.post("/v1/tasks", content=third.body, headers=third.headers())
    assert refused.status_code == 402 and refused.json()["error"] == "insufficient_budget"
