"""No single task stops another's settlement: a claim batch holding one task the escrow cannot
settle claims (and then finalizes) every other task, the bad one set aside with a log line and
a metric.

A real daemon on anvil with the real escrow. The bad task is written into the journal as a
daemon of an earlier version could have: acked at an index past the escrow's ``MAX_TASKS``, or
acked for a request the deal's client never signed.
"""

from __future__ import annotations

import logging

import pytest
from fastapi.testclient import TestClient

from contracts.binding import TASK_CLAIMED, TASK_NONE
from contracts.messages import address_of
from provider.daemon import Daemon
from provider.receipts import ack_price
from provider.settlement.context import SET_ASIDE
from provider.task_index import MAX_TASKS
from tests.polling import wait_until
from tests.provider.daemon_support import ChainWorld, SignedTask, sign_task, tiny_mlp_envelope


def deliver(api: TestClient, task: SignedTask) -> None:
    reply = api.post("/v1/tasks", content=task.body, headers=task.headers(), params={"wait": 60})
    assert reply.json()["state"] == "succeeded", reply.text


def forge_delivered(daemon: Daemon, task: SignedTask) -> None:
    """Journal and run ``task`` as an older daemon did, without today's checks; wait for it."""
    service = daemon.service
    request = task.request
    deal = daemon.deals.get(request.deal_id)
    plan = daemon.deals.plan_of(deal)
    assert plan is not None
    decoded = service.checks.check_envelope(request, None, task.body)
    price = ack_price(plan, request)
    now = daemon.clock.now()
    record = service._ack(request, task.signature, request.struct_hash(), None, price, now)
    daemon.journal.record_ack(record, task.body)
    service.runner.start(record, plan, task.body, decoded)
    key = (request.deal_id, request.task_index)
    wait_until(lambda: daemon.journal.receipt(key) is not None, 120, "the forged task delivered")


def failures(daemon: Daemon) -> float:
    value = daemon.metrics.settlement_failures.labels(SET_ASIDE)._value.get()
    return float(value)


@pytest.mark.parametrize("bad", ["index_past_max_tasks", "request_not_signed_by_client"])
def test_claim_when_one_task_cannot_settle_then_the_others_are_claimed_and_paid(
    api: TestClient,
    chain_world: ChainWorld,
    daemon: Daemon,
    bad: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    world = chain_world
    envelope = tiny_mlp_envelope()[0]
    deal_id = world.open_deal()
    good = [sign_task(world, world.client, deal_id, i, envelope) for i in range(3)]
    for task in good:
        deliver(api, task)
    if bad == "index_past_max_tasks":
        forged = sign_task(world, world.client, deal_id, MAX_TASKS + 4_464, envelope)
    else:  # signed by a stranger: the escrow's signature check reverts, naming no task
        forged = sign_task(world, world.other_client, deal_id, 3, envelope)
    forge_delivered(daemon, forged)
    provider = address_of(world.provider)
    balance = world.escrow.balance_of(provider)
    set_aside_before = failures(daemon)

    with caplog.at_level(logging.ERROR, logger="provider.settlement"):
        claimed = daemon.jobs.claim_due(force=True, deals=[deal_id])

    assert [sorted(c.data["tasks"]) for c in claimed] == [[0, 1, 2]]
    assert [world.escrow.task_status(deal_id, i) for i in range(3)] == [TASK_CLAIMED] * 3
    if bad == "request_not_signed_by_client":
        assert world.escrow.task_status(deal_id, 3) == TASK_NONE
    assert failures(daemon) == set_aside_before + 1
    assert any("task set aside" in r.getMessage() for r in caplog.records)
    world.advance_to(max(int(c.data["deadline"]) for c in claimed) + 1)
    finalized = daemon.jobs.finalize_claims(deals=[deal_id])
    assert len(finalized) == 1
    paid = sum(int(c.data["amount"]) for c in claimed)
    assert world.escrow.balance_of(provider) == balance + paid
