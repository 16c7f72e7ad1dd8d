"""SLO breach refunds with penalty, and closing deals."""

from __future__ import annotations

from dataclasses import replace

import pytest

from contracts import reverts
from contracts.binding import DEAL_CLOSED, TASK_REFUNDED
from contracts.messages import Ack, address_of

from .builders import DEFAULT_PLAN, ack, open_deal, receipt, voucher
from .conftest import World


def _breach(world: World, deal_id: int, task: int, *, price: int = 500, grace: int = 60) -> Ack:
    a = ack(deal_id, task, deadline=world.now() + 10, price=price)
    world.anvil.increase_time(10 + grace + 1)
    return a


def test_refund_when_deadline_and_grace_passed_then_refunds_price_and_penalty(world: World) -> None:
    client, provider = world.clients[0], world.providers[0]
    deal_id, q = open_deal(world, client, provider, max_spend=10_000, deposit=10_000)
    a = _breach(world, deal_id, 4, price=800)
    result = world.escrow.refund_breach(world.stranger, a, a.sign(world.escrow.domain, provider))
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
        world.escrow.refund_breach(client, a, a.sign(world.escrow.domain, provider))


def test_refund_when_deadline_not_passed_with_grace_then_rejects(world: World) -> None:
    client, provider = world.clients[0], world.providers[0]
    deal_id, _ = open_deal(world, client, provider)
    a = ack(deal_id, 0, deadline=world.now() + 10)
    world.anvil.increase_time(30)  # past the deadline, inside the grace
    with pytest.raises(reverts.EscrowDeadlineNotPassed):
        world.escrow.refund_breach(client, a, a.sign(world.escrow.domain, provider))


def test_refund_when_task_was_vouched_then_rejects(world: World) -> None:
    client, provider = world.clients[0], world.providers[0]
    deal_id, _ = open_deal(world, client, provider)
    v = voucher(deal_id, 500, [2])
    world.escrow.redeem_voucher(provider, v, v.sign(world.escrow.domain, client))
    a = _breach(world, deal_id, 2)
    with pytest.raises(reverts.EscrowTaskAlreadySettled):
        world.escrow.refund_breach(client, a, a.sign(world.escrow.domain, provider))


def test_refund_when_delivery_was_claimed_then_rejects(world: World) -> None:
    client, provider = world.clients[0], world.providers[0]
    deal_id, _ = open_deal(world, client, provider)
    r = receipt(deal_id, 1, DEFAULT_PLAN, deadline=world.now() + 10)
    world.escrow.claim_receipts(
        provider, deal_id, DEFAULT_PLAN, [r], [r.sign(world.escrow.domain, provider)]
    )
    a = _breach(world, deal_id, 1)
    with pytest.raises(reverts.EscrowTaskAlreadySettled):
        world.escrow.refund_breach(client, a, a.sign(world.escrow.domain, provider))


def test_refund_when_ack_not_signed_by_provider_then_rejects(world: World) -> None:
    client, provider = world.clients[0], world.providers[0]
    deal_id, _ = open_deal(world, client, provider)
    a = _breach(world, deal_id, 0)
    with pytest.raises(reverts.EscrowInvalidSignature):
        world.escrow.refund_breach(client, a, a.sign(world.escrow.domain, client))


def test_refund_when_ack_from_other_deal_then_rejects(world: World) -> None:
    client, provider = world.clients[0], world.providers[0]
    deal_a, _ = open_deal(world, client, provider)
    deal_b, _ = open_deal(world, client, provider)
    a = _breach(world, deal_a, 0)
    sig = a.sign(world.escrow.domain, provider)
    with pytest.raises(reverts.EscrowInvalidSignature):
        world.escrow.refund_breach(client, replace(a, deal_id=deal_b), sig)


def test_refund_when_task_index_too_large_then_rejects(world: World) -> None:
    client, provider = world.clients[0], world.providers[0]
    deal_id, _ = open_deal(world, client, provider)
    a = _breach(world, deal_id, 70_000)
    with pytest.raises(reverts.EscrowTaskIndexTooLarge):
        world.escrow.refund_breach(client, a, a.sign(world.escrow.domain, provider))


def test_refund_when_stake_and_budget_short_then_caps_both(world: World) -> None:
    client, provider = world.clients[0], world.providers[0]
    deal_id, _ = open_deal(world, client, provider, max_spend=300, stake=100, penalty=1_000)
    a = _breach(world, deal_id, 0, price=500)
    result = world.escrow.refund_breach(client, a, a.sign(world.escrow.domain, provider))
    assert result.event("BreachRefunded").args["refund"] == 300
    assert result.event("BreachRefunded").args["penalty"] == 100
    assert world.escrow.get_deal(deal_id).stake == 0


def test_close_when_expired_then_returns_unspent_and_stake(world: World) -> None:
    client, provider = world.clients[0], world.providers[0]
    deal_id, q = open_deal(world, client, provider, max_spend=10_000, duration=100)
    v = voucher(deal_id, 2_500, [0])
    world.escrow.redeem_voucher(provider, v, v.sign(world.escrow.domain, client))
    with pytest.raises(reverts.EscrowUnauthorized):
        world.escrow.close_deal(world.stranger, deal_id)
    world.anvil.increase_time(100 + q.challenge_window)
    with pytest.raises(reverts.EscrowUnauthorized):
        world.escrow.close_deal(world.stranger, deal_id)
    result = world.escrow.close_deal(client, deal_id)
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
        world.escrow.redeem_voucher(provider, v, v.sign(world.escrow.domain, client))


def test_close_before_expiry_needs_both_parties(world: World) -> None:
    client, provider = world.clients[0], world.providers[0]
    deal_id, _ = open_deal(world, client, provider, max_spend=10_000)
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
    r = receipt(deal_id, 0, DEFAULT_PLAN, deadline=world.now() + 10)
    world.escrow.claim_receipts(
        provider, deal_id, DEFAULT_PLAN, [r], [r.sign(world.escrow.domain, provider)]
    )
    world.escrow.close_deal(client, deal_id)
    with pytest.raises(reverts.EscrowClaimsPending):
        world.escrow.close_deal(provider, deal_id)
    world.anvil.increase_time(61)
    world.escrow.finalize_claim(world.stranger, deal_id, 0)
    world.escrow.close_deal(provider, deal_id)
    assert world.escrow.balance_of(address_of(client)) == 10_000 - r.amount
    assert world.escrow.balance_of(address_of(provider)) == r.amount
