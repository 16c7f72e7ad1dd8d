"""SLO breach refunds with penalty, and closing deals."""

from __future__ import annotations

from dataclasses import replace

import pytest

from contracts import reverts
from contracts.binding import DEAL_CLOSED, DEAL_OPEN, TASK_NONE, TASK_REFUNDED
from contracts.messages import address_of

from .builders import (
    WINDOW,
    SignedTask,
    claim,
    open_deal,
    redeem,
    refund,
    settle_by,
    signed_task,
    voucher,
)
from .conftest import World


def _breached(world: World, deal_id: int, index: int, **kwargs: object) -> SignedTask:
    """Return a task whose deadline is 10 s away, with time moved just past its settleBy."""
    client, provider = world.clients[0], world.providers[0]
    task = signed_task(
        world,
        deal_id,
        index,
        client,
        provider,
        deadline=world.now() + 10,
        **kwargs,  # type: ignore[arg-type]
    )
    world.anvil.increase_time(10 + WINDOW + 1)
    return task


def test_refund_when_settle_by_passed_then_refunds_price_and_penalty(world: World) -> None:
    client, provider = world.clients[0], world.providers[0]
    deal_id, q = open_deal(world, client, provider, max_spend=10_000, deposit=10_000)
    task = _breached(world, deal_id, 4, ack_price=800)
    result = refund(world, client, task)
    assert result.event("BreachRefunded").args == {
        "dealId": deal_id,
        "taskIndex": 4,
        "refund": 800,
        "penalty": q.penalty,
    }
    assert world.escrow.balance_of(address_of(client)) == 800 + q.penalty
    deal = world.escrow.get_deal(deal_id)
    assert (deal.committed, deal.stake) == (800, q.stake - q.penalty)
    assert world.escrow.task_status(deal_id, 4) == TASK_REFUNDED
    with pytest.raises(reverts.EscrowTaskAlreadySettled):
        refund(world, client, task)


def test_refund_at_settle_by_is_refused_and_lands_one_second_later(exact_clock: World) -> None:
    world = exact_clock
    client, provider = world.clients[0], world.providers[0]
    deal_id, _ = open_deal(world, client, provider)
    task = signed_task(world, deal_id, 0, client, provider, deadline=world.now() + 10)
    instant = settle_by(task, world.escrow.get_deal(deal_id).expiry, WINDOW)
    world.next_at(instant)
    with pytest.raises(reverts.EscrowDeadlineNotPassed) as info:
        refund(world, client, task)
    assert info.value.error_args == {"refundableAt": instant}
    world.next_at(instant + 1)
    assert refund(world, client, task).event("BreachRefunded").args["taskIndex"] == 0


@pytest.mark.parametrize("who", ["provider", "arbiter", "stranger"])
def test_refund_when_sender_is_not_the_client_then_rejects(world: World, who: str) -> None:
    client, provider = world.clients[0], world.providers[0]
    deal_id, _ = open_deal(world, client, provider)
    task = _breached(world, deal_id, 0)
    sender = {"provider": provider, "arbiter": world.arbiter, "stranger": world.stranger}[who]
    with pytest.raises(reverts.EscrowUnauthorized):
        refund(world, sender, task)
    assert world.escrow.task_status(deal_id, 0) == TASK_NONE


def test_refund_when_task_was_vouched_then_rejects(world: World) -> None:
    client, provider = world.clients[0], world.providers[0]
    deal_id, _ = open_deal(world, client, provider)
    redeem(world, client, provider, voucher(deal_id, 500, [2]))
    task = _breached(world, deal_id, 2)
    with pytest.raises(reverts.EscrowTaskAlreadySettled):
        refund(world, client, task)


def test_refund_when_delivery_was_claimed_then_rejects(world: World) -> None:
    client, provider = world.clients[0], world.providers[0]
    deal_id, _ = open_deal(world, client, provider)
    task = signed_task(world, deal_id, 1, client, provider, deadline=world.now() + 10)
    claim(world, provider, deal_id, [task])
    world.anvil.increase_time(10 + WINDOW + 1)
    with pytest.raises(reverts.EscrowTaskAlreadySettled):
        refund(world, client, task)


def test_refund_when_ack_not_signed_by_provider_then_rejects(world: World) -> None:
    client, provider = world.clients[0], world.providers[0]
    deal_id, _ = open_deal(world, client, provider)
    task = _breached(world, deal_id, 0)
    forged = task.ack.sign(world.escrow.domain, client)
    with pytest.raises(reverts.EscrowInvalidSignature) as info:
        world.escrow.refund_breach(client, task.request, task.ack, forged)
    assert info.value.error_args == {"expectedSigner": address_of(provider)}


def test_refund_when_request_is_not_the_acked_one_then_rejects(world: World) -> None:
    client, provider = world.clients[0], world.providers[0]
    deal_id, _ = open_deal(world, client, provider)
    task = _breached(world, deal_id, 0)
    other = signed_task(world, deal_id, 1, client, provider, deadline=task.request.deadline)
    sooner = replace(task.request, deadline=task.request.deadline - 5)
    for request in (other.request, sooner, replace(task.request, max_price=1)):
        with pytest.raises(reverts.EscrowAckMismatch):
            world.escrow.refund_breach(client, request, task.ack, task.ack_sig)


def test_refund_when_ack_from_other_deal_then_rejects(world: World) -> None:
    client, provider = world.clients[0], world.providers[0]
    deal_a, _ = open_deal(world, client, provider)
    deal_b, _ = open_deal(world, client, provider)
    task = _breached(world, deal_a, 0)
    request_b = replace(task.request, deal_id=deal_b)
    ack_b = replace(task.ack, deal_id=deal_b, request_hash=request_b.struct_hash())
    with pytest.raises(reverts.EscrowInvalidSignature):
        world.escrow.refund_breach(client, request_b, ack_b, task.ack_sig)


def test_refund_when_task_index_too_large_then_rejects(world: World) -> None:
    client, provider = world.clients[0], world.providers[0]
    deal_id, _ = open_deal(world, client, provider)
    task = _breached(world, deal_id, 70_000)
    with pytest.raises(reverts.EscrowTaskIndexTooLarge):
        refund(world, client, task)


def test_refund_when_stake_and_budget_short_then_caps_both(world: World) -> None:
    client, provider = world.clients[0], world.providers[0]
    deal_id, _ = open_deal(world, client, provider, max_spend=300, stake=100, penalty=1_000)
    task = _breached(world, deal_id, 0, ack_price=500)
    result = refund(world, client, task)
    assert result.event("BreachRefunded").args["refund"] == 300
    assert result.event("BreachRefunded").args["penalty"] == 100
    assert world.escrow.get_deal(deal_id).stake == 0


def test_close_alone_waits_for_expiry_plus_two_windows(exact_clock: World) -> None:
    world = exact_clock
    client, provider = world.clients[0], world.providers[0]
    deal_id, q = open_deal(world, client, provider, max_spend=10_000, duration=100)
    redeem(world, client, provider, voucher(deal_id, 2_500, [0]))
    expiry = world.escrow.get_deal(deal_id).expiry
    world.next_at(expiry + 2 * WINDOW - 1)
    early = world.escrow.close_deal(client, deal_id)  # one second early: an agreement only
    assert [e.name for e in early.events] == ["CloseAgreed"]
    assert world.escrow.get_deal(deal_id).status == DEAL_OPEN
    with pytest.raises(reverts.EscrowUnauthorized):
        world.escrow.close_deal(world.stranger, deal_id)  # at expiry + 2 windows
    result = world.escrow.close_deal(provider, deal_id)
    assert result.event("DealClosed").args == {
        "dealId": deal_id,
        "returnedToClient": 7_500,
        "stakeReturned": q.stake,
    }
    assert world.escrow.get_deal(deal_id).status == DEAL_CLOSED
    assert world.escrow.balance_of(address_of(client)) == 7_500
    assert world.escrow.stake_of(address_of(provider)) == q.stake
    with pytest.raises(reverts.EscrowDealNotOpen):
        world.escrow.close_deal(client, deal_id)
    with pytest.raises(reverts.EscrowDealNotOpen):
        redeem(world, client, provider, voucher(deal_id, 3_000, [0, 1]))


def test_close_before_expiry_needs_both_parties(world: World) -> None:
    client, provider = world.clients[0], world.providers[0]
    deal_id, _ = open_deal(world, client, provider, max_spend=10_000)
    with pytest.raises(reverts.EscrowUnauthorized):
        world.escrow.close_deal(world.stranger, deal_id)
    first = world.escrow.close_deal(client, deal_id)
    assert first.event("CloseAgreed").args["party"] == address_of(client)
    assert world.escrow.get_deal(deal_id).client_agreed_close
    assert world.escrow.get_deal(deal_id).status != DEAL_CLOSED
    second = world.escrow.close_deal(provider, deal_id)
    assert second.event("DealClosed").args["returnedToClient"] == 10_000
    assert world.escrow.balance_of(address_of(client)) == 10_000


def test_close_when_claims_pending_then_rejects_until_finalized(world: World) -> None:
    client, provider = world.clients[0], world.providers[0]
    deal_id, _ = open_deal(world, client, provider, max_spend=10_000)
    task = signed_task(world, deal_id, 0, client, provider)
    claim(world, provider, deal_id, [task])
    world.escrow.close_deal(client, deal_id)
    with pytest.raises(reverts.EscrowClaimsPending):
        world.escrow.close_deal(provider, deal_id)
    world.anvil.increase_time(WINDOW + 1)
    world.escrow.finalize_claim(world.stranger, deal_id, 0)
    world.escrow.close_deal(provider, deal_id)
    assert world.escrow.balance_of(address_of(client)) == 10_000 - task.receipt.amount
    assert world.escrow.balance_of(address_of(provider)) == task.receipt.amount
