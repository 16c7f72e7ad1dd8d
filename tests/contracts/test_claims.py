"""Silent client: provider claims with the client's signed requests, challenge window, disputes."""

from __future__ import annotations

from dataclasses import replace

import pytest

from contracts import reverts
from contracts.binding import BATCH_DISPUTED, BATCH_PAID, BATCH_PENDING, TASK_CLAIMED
from contracts.messages import KIND_COMPILE, Plan, address_of

from .builders import DEFAULT_PLAN, WINDOW, SignedTask, claim, open_deal, refund, signed_task
from .conftest import World


def _deal(world: World, count: int = 3, **terms: object) -> tuple[int, list[SignedTask]]:
    client, provider = world.clients[0], world.providers[0]
    deal_id, _ = open_deal(world, client, provider, **terms)  # type: ignore[arg-type]
    deadline = world.now() + 100
    tasks = [
        signed_task(world, deal_id, i, client, provider, deadline=deadline) for i in range(count)
    ]
    return deal_id, tasks


def _claim(world: World, deal_id: int, tasks: list[SignedTask], plan: Plan = DEFAULT_PLAN) -> int:
    result = claim(world, world.providers[0], deal_id, tasks, plan)
    return int(result.event("ReceiptsClaimed").args["batchId"])


def test_claim_then_finalize_after_window_pays_provider(world: World) -> None:
    deal_id, tasks = _deal(world)
    total = sum(t.receipt.amount for t in tasks)
    batch = _claim(world, deal_id, tasks)
    assert world.escrow.get_deal(deal_id).pending == total
    stored = world.escrow.get_batch(deal_id, batch)
    assert (stored.status, stored.amount, stored.tasks) == (BATCH_PENDING, total, 3)
    assert [world.escrow.task_status(deal_id, t.index) for t in tasks] == [TASK_CLAIMED] * 3
    with pytest.raises(reverts.EscrowChallengeWindowOpen):
        world.escrow.finalize_claim(world.stranger, deal_id, batch)
    world.anvil.increase_time(WINDOW + 1)
    paid = world.escrow.finalize_claim(world.stranger, deal_id, batch)
    assert paid.event("ClaimFinalized").args == {
        "dealId": deal_id,
        "batchId": batch,
        "amount": total,
    }
    deal = world.escrow.get_deal(deal_id)
    assert (deal.pending, deal.committed) == (0, total)
    assert world.escrow.balance_of(address_of(world.providers[0])) == total
    assert world.escrow.get_batch(deal_id, batch).status == BATCH_PAID
    with pytest.raises(reverts.EscrowBatchWrongStatus):
        world.escrow.finalize_claim(world.stranger, deal_id, batch)


def test_claim_event_carries_the_claimed_task_indexes_in_claim_order(world: World) -> None:
    client, provider = world.clients[0], world.providers[0]
    deal_id, _ = open_deal(world, client, provider)
    tasks = [signed_task(world, deal_id, i, client, provider) for i in (300, 2, 7, 256)]
    result = claim(world, provider, deal_id, tasks)
    event = result.event("ReceiptsClaimed").args
    assert list(event["taskIndexes"]) == [300, 2, 7, 256]
    assert event["amount"] == sum(t.receipt.amount for t in tasks)
    assert event["deadline"] == world.now() + WINDOW
    assert [world.escrow.task_status(deal_id, i) for i in (2, 7, 256, 300)] == [TASK_CLAIMED] * 4


def test_claim_when_plan_differs_from_deal_then_rejects(world: World) -> None:
    deal_id, tasks = _deal(world)
    other = replace(DEFAULT_PLAN, inference_price=10**6)
    with pytest.raises(reverts.EscrowPlanMismatch):
        _claim(world, deal_id, tasks, plan=other)


def test_claim_when_batch_empty_then_rejects(world: World) -> None:
    deal_id, _ = _deal(world)
    with pytest.raises(reverts.EscrowBadBatch):
        world.escrow.claim_receipts(world.providers[0], deal_id, DEFAULT_PLAN, [])


def test_claim_when_receipt_from_other_deal_then_rejects(world: World) -> None:
    client, provider = world.clients[0], world.providers[0]
    deal_a, _ = _deal(world)
    deal_b, _ = open_deal(world, client, provider)
    of_b = signed_task(world, deal_b, 0, client, provider)
    with pytest.raises(reverts.EscrowReceiptForOtherDeal):
        claim(world, provider, deal_a, [of_b])


def test_claim_when_receipt_finished_after_deadline_then_rejects(world: World) -> None:
    deal_id, tasks = _deal(world)
    late = replace(tasks[0].receipt, finished_at=tasks[0].request.deadline + 1)
    with pytest.raises(reverts.EscrowReceiptLate):
        world.escrow.claim_receipts(
            world.providers[0], deal_id, DEFAULT_PLAN, [tasks[0].claim(late)]
        )


def test_claim_when_amount_differs_from_plan_then_rejects(world: World) -> None:
    deal_id, tasks = _deal(world)
    wrong = replace(tasks[0].receipt, amount=tasks[0].receipt.amount + 1)
    with pytest.raises(reverts.EscrowAmountMismatch) as info:
        world.escrow.claim_receipts(
            world.providers[0], deal_id, DEFAULT_PLAN, [tasks[0].claim(wrong)]
        )
    assert info.value.error_args["priced"] == tasks[0].receipt.amount


def test_claim_when_task_repeated_or_already_claimed_then_rejects(world: World) -> None:
    deal_id, tasks = _deal(world)
    with pytest.raises(reverts.EscrowTaskAlreadySettled):
        _claim(world, deal_id, [tasks[0], tasks[0]])
    _claim(world, deal_id, tasks[:1])
    with pytest.raises(reverts.EscrowTaskAlreadySettled) as info:
        _claim(world, deal_id, tasks[1:] + tasks[:1])
    assert info.value.error_args["taskIndex"] == 0


def test_claim_when_task_was_refunded_then_rejects(world: World) -> None:
    client, provider = world.clients[0], world.providers[0]
    deal_id, _ = open_deal(world, client, provider)
    breached = signed_task(world, deal_id, 0, client, provider, deadline=world.now() + 1)
    world.anvil.increase_time(1 + WINDOW + 1)
    refund(world, client, breached)
    # The same task index under a later request the client also signed: still settled.
    again = signed_task(world, deal_id, 0, client, provider)
    with pytest.raises(reverts.EscrowTaskAlreadySettled):
        claim(world, provider, deal_id, [again])


def test_claim_when_task_index_too_large_then_rejects(world: World) -> None:
    client, provider = world.clients[0], world.providers[0]
    deal_id, _ = open_deal(world, client, provider)
    big = signed_task(world, deal_id, 65_536, client, provider)
    with pytest.raises(reverts.EscrowTaskIndexTooLarge):
        claim(world, provider, deal_id, [big])


def test_claim_when_total_passes_cap_then_rejects(world: World) -> None:
    deal_id, tasks = _deal(world, max_spend=1_000)
    with pytest.raises(reverts.EscrowCapExceeded) as info:
        _claim(world, deal_id, tasks)
    assert info.value.error_args["needed"] == sum(t.receipt.amount for t in tasks)


def test_claim_prices_failed_compile_at_zero_under_outcome_plan(world: World) -> None:
    client, provider = world.clients[0], world.providers[0]
    plan = Plan(compile_price=9_000, outcome_based=True)
    deal_id, _ = open_deal(world, client, provider, plan=plan)
    failed = signed_task(
        world, deal_id, 0, client, provider, plan=plan, kind=KIND_COMPILE, status=6, max_price=1
    )
    assert failed.receipt.amount == 0
    batch = _claim(world, deal_id, [failed], plan=plan)
    assert world.escrow.get_batch(deal_id, batch).amount == 0


def test_claim_when_request_deadline_is_after_expiry_then_settles_by_expiry_plus_window(
    exact_clock: World,
) -> None:
    world = exact_clock
    client, provider = world.clients[0], world.providers[0]
    deal_id, _ = open_deal(world, client, provider, duration=100)
    expiry = world.escrow.get_deal(deal_id).expiry
    late, on_time = (
        signed_task(world, deal_id, i, client, provider, deadline=expiry + 500) for i in (0, 1)
    )
    world.next_at(expiry + WINDOW)
    claim(world, provider, deal_id, [on_time])
    with pytest.raises(reverts.EscrowClaimPeriodOver) as info:
        claim(world, provider, deal_id, [late])  # runs at expiry + window + 1
    assert info.value.error_args == {"taskIndex": 0, "settleBy": expiry + WINDOW}


def test_dispute_when_arbiter_rules_for_provider_then_pays(world: World) -> None:
    deal_id, tasks = _deal(world)
    batch = _claim(world, deal_id, tasks)
    world.escrow.dispute_claim(world.clients[0], deal_id, batch)
    assert world.escrow.get_batch(deal_id, batch).status == BATCH_DISPUTED
    with pytest.raises(reverts.EscrowBatchWrongStatus):
        world.escrow.finalize_claim(world.stranger, deal_id, batch)
    result = world.escrow.resolve_dispute(world.arbiter, deal_id, batch, True)
    total = sum(t.receipt.amount for t in tasks)
    assert result.event("DisputeResolved").args == {
        "dealId": deal_id,
        "batchId": batch,
        "providerWins": True,
        "amount": total,
        "refund": 0,
        "penalty": 0,
    }
    assert world.escrow.balance_of(address_of(world.providers[0])) == total
    assert world.escrow.get_batch(deal_id, batch).status == BATCH_PAID
    with pytest.raises(reverts.EscrowBatchWrongStatus):
        world.escrow.resolve_dispute(world.arbiter, deal_id, batch, True)


def test_dispute_when_window_closed_then_rejects(world: World) -> None:
    deal_id, tasks = _deal(world)
    batch = _claim(world, deal_id, tasks)
    world.anvil.increase_time(WINDOW + 1)
    with pytest.raises(reverts.EscrowChallengeWindowClosed):
        world.escrow.dispute_claim(world.clients[0], deal_id, batch)


def test_lapse_dispute_when_arbitration_open_or_batch_not_disputed_then_rejects(
    world: World,
) -> None:
    deal_id, tasks = _deal(world)
    batch = _claim(world, deal_id, tasks)
    with pytest.raises(reverts.EscrowBatchWrongStatus):
        world.escrow.lapse_dispute(world.stranger, deal_id, batch)
    world.escrow.dispute_claim(world.clients[0], deal_id, batch)
    with pytest.raises(reverts.EscrowArbitrationOpen):
        world.escrow.lapse_dispute(world.stranger, deal_id, batch)


def test_batch_when_unknown_then_rejects(world: World) -> None:
    deal_id, _ = _deal(world)
    with pytest.raises(reverts.EscrowBatchNotFound):
        world.escrow.get_batch(deal_id, 0)
    with pytest.raises(reverts.EscrowBatchNotFound):
        world.escrow.finalize_claim(world.stranger, deal_id, 0)
    with pytest.raises(reverts.EscrowBatchNotFound):
        world.escrow.dispute_claim(world.clients[0], deal_id, 0)
