"""Every attack on the escrow found against settlement v1, each refused or paid to the right party.

One test per attack (issue 10); each one passed on the v1 contract, in the attacker's favour.
Numbers in the names follow the issue's list. The smart-contract wallet attacks (ERC-1271) are in
`test_wallets.py`; the random mix of all of them is `test_escrow_stateful.py`.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from contracts import reverts
from contracts.binding import (
    BATCH_REJECTED,
    DEAL_CLOSED,
    DEAL_OPEN,
    TASK_CLAIMED,
    TASK_NONE,
    TASK_REFUNDED,
    TASK_VOUCHED,
)
from contracts.messages import ZERO_ADDRESS, Plan, Voucher, address_of

from .builders import (
    DEFAULT_PLAN,
    WINDOW,
    bits,
    claim,
    open_deal,
    quote,
    redeem,
    refund,
    settle_by,
    signed_task,
    voucher,
)
from .conftest import ARBITRATION_PERIOD, MIN_WINDOW, World

ALL_TASKS = (2**256 - 1,) * 256  # a bitmap that marks every task index, 0 to 65,535


# ---------------------------------------------------------------- 1: vouchers


def test_attack1_client_redeems_its_own_one_unit_voucher_for_every_task_is_refused(
    world: World,
) -> None:
    client, provider = world.clients[0], world.providers[0]
    deal_id, _ = open_deal(world, client, provider)
    delivered = [
        signed_task(world, deal_id, i, client, provider, device_ms=100 * i) for i in range(5)
    ]
    crafted = Voucher(deal_id=deal_id, cumulative_amount=1, tasks=ALL_TASKS)
    with pytest.raises(reverts.EscrowUnauthorized) as info:
        redeem(world, client, client, crafted)
    assert info.value.error_args == {"account": address_of(client)}
    assert world.escrow.task_status(deal_id, 0) == TASK_NONE
    # The provider's claim of its delivered tasks then pays in full.
    owed = sum(t.receipt.amount for t in delivered)
    assert owed == 2_500 + 2 * 100 * (0 + 1 + 2 + 3 + 4)
    claim(world, provider, deal_id, delivered)
    world.anvil.increase_time(WINDOW + 1)
    world.escrow.finalize_claim(provider, deal_id, 0)
    assert world.escrow.balance_of(address_of(provider)) == owed


def test_attack1_self_dealt_voucher_shows_its_true_value_in_the_event(world: World) -> None:
    # A provider paying itself through a throwaway client key can still mark every task paid,
    # but the event says what it paid: indexers score value paid, never voucher bits.
    throwaway, provider = world.clients[1], world.providers[0]
    deal_id, _ = open_deal(world, throwaway, provider)
    crafted = Voucher(deal_id=deal_id, cumulative_amount=1, tasks=ALL_TASKS)
    event = redeem(world, throwaway, provider, crafted).event("VoucherRedeemed").args
    assert (event["cumulativeAmount"], event["paid"]) == (1, 1)
    assert len(bits(event["newTasks"])) == 65_536
    assert world.escrow.get_deal(deal_id).committed == 1


# ---------------------------------------------------------------- 2: refund versus a held voucher


def test_attack2_refund_after_the_provider_redeemed_a_voucher_covering_the_task_is_refused(
    exact_clock: World,
) -> None:
    world = exact_clock
    client, provider = world.clients[0], world.providers[0]
    deal_id, q = open_deal(world, client, provider)
    task = signed_task(world, deal_id, 0, client, provider, deadline=world.now() + 20)
    instant = settle_by(task, world.escrow.get_deal(deal_id).expiry, WINDOW)
    paid = voucher(deal_id, task.receipt.amount, [0])
    world.next_at(instant)  # the provider redeems at the last second of the task's settlement
    redeem(world, client, provider, paid)
    with pytest.raises(reverts.EscrowTaskAlreadySettled) as info:
        refund(world, client, task)  # settleBy + 1
    assert info.value.error_args == {"dealId": deal_id, "taskIndex": 0}
    assert world.now() == instant  # the refund mined nothing
    assert world.escrow.task_status(deal_id, 0) == TASK_VOUCHED
    assert world.escrow.balance_of(address_of(provider)) == task.receipt.amount
    assert world.escrow.balance_of(address_of(client)) == 0
    assert world.escrow.get_deal(deal_id).stake == q.stake


def test_attack2_refund_before_settle_by_is_refused_so_the_provider_can_still_redeem(
    exact_clock: World,
) -> None:
    world = exact_clock
    client, provider = world.clients[0], world.providers[0]
    deal_id, _ = open_deal(world, client, provider)
    task = signed_task(world, deal_id, 0, client, provider, deadline=world.now() + 20)
    instant = settle_by(task, world.escrow.get_deal(deal_id).expiry, WINDOW)
    world.next_at(instant)
    with pytest.raises(reverts.EscrowDeadlineNotPassed):
        refund(world, client, task)
    redeem(world, client, provider, voucher(deal_id, task.receipt.amount, [0]))  # at settleBy
    assert world.escrow.task_status(deal_id, 0) == TASK_VOUCHED


# ---------------------------------------------------------------- 3: claims need a signed request


@pytest.mark.parametrize("forgery", ["missing", "signed_by_provider", "another_requests"])
def test_attack3_claim_without_the_clients_request_signature_is_refused(
    world: World, forgery: str
) -> None:
    client, provider = world.clients[0], world.providers[0]
    deal_id, _ = open_deal(world, client, provider, max_spend=10**6)
    requested = signed_task(world, deal_id, 3, client, provider)
    # A task the client never requested (index 40,000), with a maxPrice of the whole cap: the
    # claim must carry the client's signature over exactly this request.
    invented = signed_task(world, deal_id, 40_000, provider, provider, max_price=10**6)
    signature = {
        "missing": b"",
        "signed_by_provider": invented.request_sig,
        "another_requests": requested.request_sig,
    }[forgery]
    with pytest.raises(reverts.EscrowInvalidSignature) as info:
        world.escrow.claim_receipts(
            provider, deal_id, DEFAULT_PLAN, [invented.claim(signature=signature)]
        )
    assert info.value.error_args == {"expectedSigner": address_of(client)}
    assert world.escrow.task_status(deal_id, 40_000) == TASK_NONE


def test_attack3_receipt_priced_above_the_requests_max_price_is_refused(world: World) -> None:
    client, provider = world.clients[0], world.providers[0]
    deal_id, _ = open_deal(world, client, provider)
    task = signed_task(world, deal_id, 0, client, provider, max_price=600, ack_price=580)
    # The plan prices 500 + 2/ms: 40 ms is 580; the provider reports 1,480 times the ack's price.
    inflated = replace(task.receipt, device_ms=429_000)
    inflated = replace(inflated, amount=500 + 2 * 429_000)
    with pytest.raises(reverts.EscrowPriceAboveRequest) as info:
        world.escrow.claim_receipts(provider, deal_id, DEFAULT_PLAN, [task.claim(inflated)])
    assert info.value.error_args == {"taskIndex": 0, "amount": 858_500, "maxPrice": 600}
    # Nor can the provider lift maxPrice itself: the client signed 600.
    lifted = replace(task.claim(inflated), max_price=10**6)
    with pytest.raises(reverts.EscrowInvalidSignature):
        world.escrow.claim_receipts(provider, deal_id, DEFAULT_PLAN, [lifted])


def test_attack3_receipt_deadline_other_than_the_signed_requests_is_refused(world: World) -> None:
    client, provider = world.clients[0], world.providers[0]
    deal_id, _ = open_deal(world, client, provider)
    task = signed_task(world, deal_id, 0, client, provider, deadline=world.now() + 10)
    # A delivery 30 s late, presented as on time by moving the deadline.
    moved = replace(
        task.receipt, deadline=task.request.deadline + 40, finished_at=task.request.deadline + 30
    )
    with pytest.raises(reverts.EscrowInvalidSignature):
        world.escrow.claim_receipts(provider, deal_id, DEFAULT_PLAN, [task.claim(moved)])


@pytest.mark.parametrize("window", [0, MIN_WINDOW - 1])
def test_attack3_challenge_window_zero_or_below_minimum_is_refused(
    world: World, window: int
) -> None:
    client, provider = world.clients[0], world.providers[0]
    world.escrow.deposit(client, 10**6)
    q = quote(world, provider, client, stake=0, challenge_window=window)
    with pytest.raises(reverts.EscrowChallengeWindowTooShort) as info:
        world.escrow.open_deal(client, q, q.sign(world.escrow.domain, provider), 10**6)
    assert info.value.error_args == {"challengeWindow": window, "minimum": MIN_WINDOW}
    assert world.escrow.min_challenge_window() == MIN_WINDOW
    at_minimum = quote(world, provider, client, stake=0, challenge_window=MIN_WINDOW)
    world.escrow.open_deal(
        client, at_minimum, at_minimum.sign(world.escrow.domain, provider), 10**6
    )


# ---------------------------------------------------------------- 4: claims cannot erase a breach


def test_attack4_claim_after_settle_by_is_refused_so_it_cannot_front_run_a_refund(
    exact_clock: World,
) -> None:
    world = exact_clock
    client, provider = world.clients[0], world.providers[0]
    deal_id, q = open_deal(world, client, provider)
    deadline = world.now() + 20
    on_time, breached = (
        signed_task(world, deal_id, i, client, provider, deadline=deadline) for i in (0, 1)
    )
    instant = settle_by(breached, world.escrow.get_deal(deal_id).expiry, WINDOW)
    world.next_at(instant)
    claim(world, provider, deal_id, [on_time])  # lands at settleBy: the last second allowed
    with pytest.raises(reverts.EscrowClaimPeriodOver) as info:
        claim(world, provider, deal_id, [breached])  # settleBy + 1
    assert info.value.error_args == {"taskIndex": 1, "settleBy": instant}
    event = refund(world, client, breached).event("BreachRefunded").args  # same second
    assert (event["refund"], event["penalty"]) == (breached.ack.price, q.penalty)
    assert world.escrow.task_status(deal_id, 1) == TASK_REFUNDED


@pytest.mark.parametrize("ending", ["ruling", "lapse"])
def test_attack4_client_who_wins_a_dispute_gets_refund_and_penalty_per_task(
    world: World, ending: str
) -> None:
    client, provider = world.clients[0], world.providers[0]
    deal_id, q = open_deal(world, client, provider, max_spend=100_000, stake=500_000)
    # Three acked tasks never delivered; the provider claims them with made-up receipts.
    fabricated = [signed_task(world, deal_id, i, client, provider) for i in range(3)]
    total = sum(t.receipt.amount for t in fabricated)
    claim(world, provider, deal_id, fabricated)
    world.escrow.dispute_claim(client, deal_id, 0)
    if ending == "ruling":
        result = world.escrow.resolve_dispute(world.arbiter, deal_id, 0, False)
    else:
        world.anvil.increase_time(ARBITRATION_PERIOD)
        result = world.escrow.lapse_dispute(world.stranger, deal_id, 0)
    assert result.event("DisputeResolved").args == {
        "dealId": deal_id,
        "batchId": 0,
        "providerWins": False,
        "amount": total,
        "refund": total,
        "penalty": 3 * q.penalty,
    }
    assert world.escrow.get_batch(deal_id, 0).status == BATCH_REJECTED
    assert world.escrow.balance_of(address_of(client)) == total + 3 * q.penalty
    assert world.escrow.balance_of(address_of(provider)) == 0
    deal = world.escrow.get_deal(deal_id)
    assert (deal.pending, deal.committed, deal.stake) == (0, total, q.stake - 3 * q.penalty)
    # The tasks stay settled: no second refund, no voucher, no claim.
    assert world.escrow.task_status(deal_id, 0) == TASK_CLAIMED
    world.anvil.increase_time(ARBITRATION_PERIOD)
    with pytest.raises(reverts.EscrowTaskAlreadySettled):
        refund(world, client, fabricated[0])
    world.escrow.close_deal(client, deal_id)
    # After close the client holds its whole deposit plus three penalties; the provider nothing.
    assert world.escrow.balance_of(address_of(client)) == 100_000 + 3 * q.penalty
    assert world.escrow.balance_of(address_of(provider)) == 0
    assert world.escrow.stake_of(address_of(provider)) == q.stake - 3 * q.penalty


def test_attack4_arbiter_ruling_after_the_period_is_refused_and_lapse_applies(
    exact_clock: World,
) -> None:
    world = exact_clock
    client, provider = world.clients[0], world.providers[0]
    deal_id, _ = open_deal(world, client, provider)
    claim(world, provider, deal_id, [signed_task(world, deal_id, 0, client, provider)])
    disputed = world.escrow.dispute_claim(client, deal_id, 0)
    deadline = disputed.event("ClaimDisputed").args["arbitrationDeadline"]
    assert deadline == world.now() + world.escrow.arbitration_period()
    world.next_at(deadline)
    with pytest.raises(reverts.EscrowArbitrationOver) as info:
        world.escrow.resolve_dispute(world.arbiter, deal_id, 0, True)
    assert info.value.error_args == {"deadline": deadline}
    lapsed = world.escrow.lapse_dispute(world.stranger, deal_id, 0)  # at the deadline
    assert lapsed.event("DisputeResolved").args["providerWins"] is False


def test_attack4_arbiter_ruling_one_second_before_the_period_ends_applies(
    exact_clock: World,
) -> None:
    world = exact_clock
    client, provider = world.clients[0], world.providers[0]
    deal_id, _ = open_deal(world, client, provider)
    claim(world, provider, deal_id, [signed_task(world, deal_id, 0, client, provider)])
    deadline = (
        world.escrow.dispute_claim(client, deal_id, 0)
        .event("ClaimDisputed")
        .args["arbitrationDeadline"]
    )
    world.next_at(deadline - 1)
    with pytest.raises(reverts.EscrowArbitrationOpen):
        world.escrow.lapse_dispute(world.stranger, deal_id, 0)
    world.escrow.resolve_dispute(world.arbiter, deal_id, 0, True)
    with pytest.raises(reverts.EscrowBatchWrongStatus):
        world.escrow.lapse_dispute(world.stranger, deal_id, 0)


# ---------------------------------------------------------------- 5: quotes name their client


def test_attack5_stranger_opening_a_quote_for_another_client_is_refused(world: World) -> None:
    client, provider = world.clients[0], world.providers[0]
    world.escrow.deposit(client, 10**6)
    world.escrow.deposit(world.stranger, 10**6)
    world.escrow.stake(provider, 10**6)
    q = quote(world, provider, client, stake=10**6, max_spend=10**6)
    sig = q.sign(world.escrow.domain, provider)
    with pytest.raises(reverts.EscrowWrongClient) as info:
        world.escrow.open_deal(world.stranger, q, sig, 1)
    assert info.value.error_args == {
        "expected": address_of(client),
        "actual": address_of(world.stranger),
    }
    # Nothing locked, the nonce unused: the named client opens the deal.
    assert world.escrow.stake_of(address_of(provider)) == 10**6
    assert not world.escrow.is_nonce_used(address_of(provider), q.nonce)
    world.escrow.open_deal(client, q, sig, 10**6)
    assert world.escrow.stake_of(address_of(provider)) == 0


def test_attack5_quote_naming_no_client_is_refused(world: World) -> None:
    client, provider = world.clients[0], world.providers[0]
    world.escrow.deposit(client, 10**6)
    q = replace(quote(world, provider, client, stake=0), client=ZERO_ADDRESS)
    with pytest.raises(reverts.EscrowWrongClient) as info:
        world.escrow.open_deal(client, q, q.sign(world.escrow.domain, provider), 10**6)
    assert info.value.error_args["expected"] == ZERO_ADDRESS


# ---------------------------------------------------------------- 6: smaller holes


@pytest.mark.parametrize("party", ["provider", "client"])
def test_attack6_arbiter_who_is_the_provider_or_the_client_is_refused(
    world: World, party: str
) -> None:
    # An arbiter that is a party rules its own disputes: a provider arbiter keeps a made-up
    # claim the client disputed, a client arbiter takes back every claim it disputes. The SDK
    # refused such quotes; the escrow now does too, so no other client or market has to.
    client, provider = world.clients[0], world.providers[0]
    world.escrow.deposit(client, 10**6)
    world.escrow.stake(provider, 10**6)
    judge = address_of(provider if party == "provider" else client)
    q = replace(quote(world, provider, client), arbiter=judge)
    with pytest.raises(reverts.EscrowInvalidTerms):
        world.escrow.open_deal(client, q, q.sign(world.escrow.domain, provider), 10**6)
    assert not world.escrow.is_nonce_used(address_of(provider), q.nonce)
    fair = replace(q, arbiter=address_of(world.arbiter))
    opened = world.escrow.open_deal(client, fair, fair.sign(world.escrow.domain, provider), 10**6)
    deal_id = int(opened.event("DealOpened").args["dealId"])
    assert world.escrow.get_deal(deal_id).arbiter == address_of(world.arbiter)


def test_attack6_close_at_expiry_plus_window_leaves_the_client_a_window_to_refund(
    exact_clock: World,
) -> None:
    world = exact_clock
    client, provider = world.clients[0], world.providers[0]
    deal_id, q = open_deal(world, client, provider, max_spend=10_000, duration=200)
    expiry = world.escrow.get_deal(deal_id).expiry
    task = signed_task(world, deal_id, 0, client, provider, deadline=expiry)  # never delivered
    world.next_at(expiry + WINDOW)
    attempt = world.escrow.close_deal(provider, deal_id)
    assert [e.name for e in attempt.events] == ["CloseAgreed"]
    assert world.escrow.get_deal(deal_id).status == DEAL_OPEN
    world.next_at(expiry + 2 * WINDOW - 1)
    event = refund(world, client, task).event("BreachRefunded").args
    assert (event["refund"], event["penalty"]) == (task.ack.price, q.penalty)
    closed = world.escrow.close_deal(provider, deal_id)  # expiry + 2 windows: alone
    assert closed.event("DealClosed").args["returnedToClient"] == 10_000 - task.ack.price
    assert world.escrow.balance_of(address_of(client)) == 10_000 + q.penalty


def test_attack6_one_address_as_client_and_provider_closes_early(world: World) -> None:
    both = world.clients[2]
    deal_id, q = open_deal(world, both, both, max_spend=10_000)
    result = world.escrow.close_deal(both, deal_id)
    assert [e.name for e in result.events] == ["CloseAgreed", "DealClosed"]
    assert world.escrow.get_deal(deal_id).status == DEAL_CLOSED
    assert world.escrow.balance_of(address_of(both)) == 10_000
    assert world.escrow.stake_of(address_of(both)) == q.stake


def test_attack6_task_status_past_the_last_index_reverts(world: World) -> None:
    deal_id, _ = open_deal(world, world.clients[0], world.providers[0])
    assert world.escrow.task_status(deal_id, 65_535) == TASK_NONE
    with pytest.raises(reverts.EscrowTaskIndexTooLarge) as info:
        world.escrow.task_status(deal_id, 65_536)
    assert info.value.error_args == {"taskIndex": 65_536}


def test_attack6_reservation_fee_credit_emits_an_event(world: World) -> None:
    client, provider = world.clients[0], world.providers[0]
    plan = Plan(inference_price=100, reservation_fee=25_000, reserved_discount_bps=2_000)
    world.escrow.deposit(client, 10**6)
    world.escrow.stake(provider, 10**6)
    q = quote(world, provider, client, plan=plan)
    result = world.escrow.open_deal(client, q, q.sign(world.escrow.domain, provider), 10**6)
    deal_id = result.event("DealOpened").args["dealId"]
    assert [e.name for e in result.events] == ["DealOpened", "ReservationFeePaid"]
    assert result.event("ReservationFeePaid").args == {
        "dealId": deal_id,
        "provider": address_of(provider),
        "fee": 25_000,
    }
    assert world.escrow.balance_of(address_of(provider)) == 25_000


def test_attack6_deal_opened_event_carries_every_term(world: World) -> None:
    client, provider = world.clients[0], world.providers[0]
    world.escrow.deposit(client, 10**7)
    world.escrow.stake(provider, 10**6)
    q = quote(
        world,
        provider,
        client,
        max_spend=4 * 10**6,
        stake=10**6,
        penalty=777,
        challenge_window=45,
        slo_ms=1_500,
    )
    result = world.escrow.open_deal(client, q, q.sign(world.escrow.domain, provider), 4 * 10**6)
    assert result.event("DealOpened").args == {
        "dealId": world.escrow.deal_count(),
        "client": address_of(client),
        "provider": address_of(provider),
        "arbiter": address_of(world.arbiter),
        "maxSpend": 4 * 10**6,
        "stake": 10**6,
        "penalty": 777,
        "expiry": world.now() + q.duration,
        "challengeWindow": 45,
        "sloMs": 1_500,
        "planHash": q.plan.struct_hash(),
        "quoteHash": q.struct_hash(),
    }


def test_attack6_voucher_for_the_largest_amount_reverts_cap_exceeded_not_a_panic(
    world: World,
) -> None:
    client, provider = world.clients[0], world.providers[0]
    deal_id, _ = open_deal(world, client, provider, max_spend=5_000)
    redeem(world, client, provider, voucher(deal_id, 1_000, [0]))
    with pytest.raises(reverts.EscrowCapExceeded) as info:
        redeem(world, client, provider, voucher(deal_id, 2**256 - 1, [0, 1]))
    assert info.value.error_args == {"dealId": deal_id, "cap": 5_000, "needed": 2**256 - 1}


# ---------------------------------------------------------------- P3: third parties


@pytest.mark.parametrize(
    "action", ["redeem", "claim", "refund", "dispute", "rule", "close_early", "close_late"]
)
def test_attack_third_party_cannot_settle_or_close_anothers_deal(world: World, action: str) -> None:
    client, provider, stranger = world.clients[0], world.providers[0], world.stranger
    deal_id, _ = open_deal(world, client, provider, duration=100)
    task = signed_task(world, deal_id, 0, client, provider, deadline=world.now() + 10)
    paid = voucher(deal_id, task.receipt.amount, [0])
    escrow = world.escrow
    if action in ("dispute", "rule"):
        claim(world, provider, deal_id, [task])
        if action == "rule":
            escrow.dispute_claim(client, deal_id, 0)
    if action in ("refund", "close_late"):
        world.anvil.increase_time(100 + 2 * WINDOW)
    calls = {
        "redeem": lambda: escrow.redeem_voucher(stranger, paid, paid.sign(escrow.domain, client)),
        "claim": lambda: escrow.claim_receipts(stranger, deal_id, DEFAULT_PLAN, [task.claim()]),
        "refund": lambda: escrow.refund_breach(stranger, task.request, task.ack, task.ack_sig),
        "dispute": lambda: escrow.dispute_claim(stranger, deal_id, 0),
        "rule": lambda: escrow.resolve_dispute(stranger, deal_id, 0, False),
        "close_early": lambda: escrow.close_deal(stranger, deal_id),
        "close_late": lambda: escrow.close_deal(stranger, deal_id),
    }
    with pytest.raises(reverts.EscrowUnauthorized) as info:
        calls[action]()
    assert info.value.error_args == {"account": address_of(stranger)}
    deal = escrow.get_deal(deal_id)
    assert (deal.status, deal.client_agreed_close, deal.provider_agreed_close) == (
        DEAL_OPEN,
        False,
        False,
    )
