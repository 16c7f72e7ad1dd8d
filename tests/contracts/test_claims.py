"""Silent client: provider claims of receipts, challenge window, disputes and arbitration."""

from __future__ import annotations

from dataclasses import replace

import pytest

from contracts import reverts
from contracts.binding import BATCH_DISPUTED, BATCH_PAID, BATCH_PENDING, BATCH_REJECTED
from contracts.messages import KIND_COMPILE, Plan, Receipt, address_of

from .builders import DEFAULT_PLAN, ack, open_deal, receipt
from .conftest import World

ARBITRATION_PERIOD = 7 * 24 * 3600


def _claim(
    world: World,
    deal_id: int,
    receipts: list[Receipt],
    plan: Plan = DEFAULT_PLAN,
    signer: str | None = None,
) -> int:
    provider = world.providers[0]
    sigs = [r.sign(world.escrow.domain, signer or provider) for r in receipts]
    result = world.escrow.claim_receipts(provider, deal_id, plan, receipts, sigs)
    return int(result.event("ReceiptsClaimed").args["batchId"])


def _deal(world: World, **terms: object) -> tuple[int, list[Receipt]]:
    deal_id, _ = open_deal(world, world.clients[0], world.providers[0], **terms)  # type: ignore[arg-type]
    deadline = world.now() + 100
    return deal_id, [receipt(deal_id, i, DEFAULT_PLAN, deadline=deadline) for i in range(3)]


def test_claim_then_finalize_after_window_pays_provider(world: World) -> None:
    deal_id, receipts = _deal(world)
    total = sum(r.amount for r in receipts)
    batch = _claim(world, deal_id, receipts)
    assert world.escrow.get_deal(deal_id).pending == total
    assert world.escrow.get_batch(deal_id, batch).status == BATCH_PENDING
    with pytest.raises(reverts.EscrowChallengeWindowOpen):
        world.escrow.finalize_claim(world.stranger, deal_id, batch)
    world.anvil.increase_time(61)
    world.escrow.finalize_claim(world.stranger, deal_id, batch)
    deal = world.escrow.get_deal(deal_id)
    assert (deal.pending, deal.committed) == (0, total)
    assert world.escrow.balance_of(address_of(world.providers[0])) == total
    assert world.escrow.get_batch(deal_id, batch).status == BATCH_PAID
    with pytest.raises(reverts.EscrowBatchWrongStatus):
        world.escrow.finalize_claim(world.stranger, deal_id, batch)


def test_claim_when_not_provider_then_rejects(world: World) -> None:
    deal_id, receipts = _deal(world)
    sigs = [r.sign(world.escrow.domain, world.providers[0]) for r in receipts]
    with pytest.raises(reverts.EscrowUnauthorized):
        world.escrow.claim_receipts(world.clients[0], deal_id, DEFAULT_PLAN, receipts, sigs)


def test_claim_when_claim_period_over_then_rejects(world: World) -> None:
    deal_id, receipts = _deal(world, duration=50)
    world.anvil.increase_time(50 + 60)
    with pytest.raises(reverts.EscrowClaimPeriodOver):
        _claim(world, deal_id, receipts)


def test_claim_when_plan_differs_from_deal_then_rejects(world: World) -> None:
    deal_id, receipts = _deal(world)
    other = replace(DEFAULT_PLAN, inference_price=10**6)
    with pytest.raises(reverts.EscrowPlanMismatch):
        _claim(world, deal_id, [replace(r, amount=r.amount) for r in receipts], plan=other)


def test_claim_when_batch_empty_or_signatures_missing_then_rejects(world: World) -> None:
    deal_id, receipts = _deal(world)
    with pytest.raises(reverts.EscrowBadBatch):
        world.escrow.claim_receipts(world.providers[0], deal_id, DEFAULT_PLAN, [], [])
    with pytest.raises(reverts.EscrowBadBatch):
        world.escrow.claim_receipts(world.providers[0], deal_id, DEFAULT_PLAN, receipts, [])


def test_claim_when_receipt_from_other_deal_then_rejects(world: World) -> None:
    deal_id, receipts = _deal(world)
    with pytest.raises(reverts.EscrowReceiptForOtherDeal):
        _claim(world, deal_id, [replace(receipts[0], deal_id=deal_id + 1)])


def test_claim_when_receipt_finished_after_deadline_then_rejects(world: World) -> None:
    deal_id, receipts = _deal(world)
    late = replace(receipts[0], finished_at=receipts[0].deadline + 1)
    with pytest.raises(reverts.EscrowReceiptLate):
        _claim(world, deal_id, [late])


def test_claim_when_amount_differs_from_plan_then_rejects(world: World) -> None:
    deal_id, receipts = _deal(world)
    with pytest.raises(reverts.EscrowAmountMismatch) as info:
        _claim(world, deal_id, [replace(receipts[0], amount=receipts[0].amount + 1)])
    assert info.value.error_args["priced"] == receipts[0].amount


def test_claim_when_receipt_signed_by_someone_else_then_rejects(world: World) -> None:
    deal_id, receipts = _deal(world)
    with pytest.raises(reverts.EscrowInvalidSignature):
        _claim(world, deal_id, receipts, signer=world.stranger)


def test_claim_when_task_repeated_or_already_claimed_then_rejects(world: World) -> None:
    deal_id, receipts = _deal(world)
    with pytest.raises(reverts.EscrowTaskAlreadySettled):
        _claim(world, deal_id, [receipts[0], receipts[0]])
    _claim(world, deal_id, receipts[:1])
    with pytest.raises(reverts.EscrowTaskAlreadySettled):
        _claim(world, deal_id, receipts[:2])


def test_claim_when_task_was_refunded_then_rejects(world: World) -> None:
    client, provider = world.clients[0], world.providers[0]
    deal_id, receipts = _deal(world)
    a = ack(deal_id, 0, deadline=world.now() + 1)
    world.anvil.increase_time(1 + 60 + 1)
    world.escrow.refund_breach(client, a, a.sign(world.escrow.domain, provider))
    with pytest.raises(reverts.EscrowTaskAlreadySettled):
        _claim(
            world,
            deal_id,
            [replace(receipts[0], deadline=world.now() + 10, finished_at=world.now())],
        )


def test_claim_when_task_index_too_large_then_rejects(world: World) -> None:
    deal_id, receipts = _deal(world)
    big = receipt(deal_id, 65_536, DEFAULT_PLAN, deadline=receipts[0].deadline)
    with pytest.raises(reverts.EscrowTaskIndexTooLarge):
        _claim(world, deal_id, [big])


def test_claim_when_total_passes_cap_then_rejects(world: World) -> None:
    deal_id, receipts = _deal(world, max_spend=1_000)
    with pytest.raises(reverts.EscrowCapExceeded):
        _claim(world, deal_id, receipts)


def test_claim_prices_failed_compile_at_zero_under_outcome_plan(world: World) -> None:
    plan = Plan(compile_price=9_000, outcome_based=True)
    deal_id, _ = open_deal(world, world.clients[0], world.providers[0], plan=plan)
    failed = receipt(deal_id, 0, plan, deadline=world.now() + 50, kind=KIND_COMPILE, status=6)
    assert failed.amount == 0
    batch = _claim(world, deal_id, [failed], plan=plan)
    assert world.escrow.get_batch(deal_id, batch).amount == 0


def test_dispute_when_client_within_window_then_arbiter_rules_for_client(world: World) -> None:
    deal_id, receipts = _deal(world)
    batch = _claim(world, deal_id, receipts)
    with pytest.raises(reverts.EscrowUnauthorized):
        world.escrow.dispute_claim(world.stranger, deal_id, batch)
    world.escrow.dispute_claim(world.clients[0], deal_id, batch)
    assert world.escrow.get_batch(deal_id, batch).status == BATCH_DISPUTED
    with pytest.raises(reverts.EscrowBatchWrongStatus):
        world.escrow.finalize_claim(world.stranger, deal_id, batch)
    with pytest.raises(reverts.EscrowUnauthorized):
        world.escrow.resolve_dispute(world.providers[0], deal_id, batch, True)
    result = world.escrow.resolve_dispute(world.arbiter, deal_id, batch, False)
    assert result.event("DisputeResolved").args["providerWins"] is False
    deal = world.escrow.get_deal(deal_id)
    assert (deal.pending, deal.committed) == (0, 0)
    assert world.escrow.get_batch(deal_id, batch).status == BATCH_REJECTED
    assert world.escrow.balance_of(address_of(world.providers[0])) == 0


def test_dispute_when_arbiter_rules_for_provider_then_pays(world: World) -> None:
    deal_id, receipts = _deal(world)
    batch = _claim(world, deal_id, receipts)
    world.escrow.dispute_claim(world.clients[0], deal_id, batch)
    world.escrow.resolve_dispute(world.arbiter, deal_id, batch, True)
    assert world.escrow.balance_of(address_of(world.providers[0])) == sum(
        r.amount for r in receipts
    )
    with pytest.raises(reverts.EscrowBatchWrongStatus):
        world.escrow.resolve_dispute(world.arbiter, deal_id, batch, True)


def test_dispute_when_window_closed_then_rejects(world: World) -> None:
    deal_id, receipts = _deal(world)
    batch = _claim(world, deal_id, receipts)
    world.anvil.increase_time(61)
    with pytest.raises(reverts.EscrowChallengeWindowClosed):
        world.escrow.dispute_claim(world.clients[0], deal_id, batch)


def test_lapse_dispute_when_arbiter_silent_then_client_wins_after_period(world: World) -> None:
    deal_id, receipts = _deal(world)
    batch = _claim(world, deal_id, receipts)
    world.escrow.dispute_claim(world.clients[0], deal_id, batch)
    with pytest.raises(reverts.EscrowArbitrationOpen):
        world.escrow.lapse_dispute(world.stranger, deal_id, batch)
    world.anvil.increase_time(ARBITRATION_PERIOD + 1)
    world.escrow.lapse_dispute(world.stranger, deal_id, batch)
    assert world.escrow.get_batch(deal_id, batch).status == BATCH_REJECTED
    assert world.escrow.get_deal(deal_id).pending == 0


def test_lapse_dispute_when_batch_not_disputed_then_rejects(world: World) -> None:
    deal_id, receipts = _deal(world)
    batch = _claim(world, deal_id, receipts)
    with pytest.raises(reverts.EscrowBatchWrongStatus):
        world.escrow.lapse_dispute(world.stranger, deal_id, batch)


def test_batch_when_unknown_then_rejects(world: World) -> None:
    deal_id, _ = _deal(world)
    with pytest.raises(reverts.EscrowBatchNotFound):
        world.escrow.get_batch(deal_id, 0)
    with pytest.raises(reverts.EscrowBatchNotFound):
        world.escrow.finalize_claim(world.stranger, deal_id, 0)
