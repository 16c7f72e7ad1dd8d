"""Opening a deal locks stake in proportion to the spend opened; a close agreement ends; every
task index past the escrow's range gets the typed error, whatever the path.

Each `test_attack*` passed in the attacker's favour on the escrow before these rules: a client
opening a deal for one unit locked the provider's whole quoted stake; a client's early-close
agreement stayed in force for the deal's life, so a provider closed between a breach and its
refund; a refund of an index past 65,535 reverted as if it came early.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from contracts import reverts
from contracts.binding import DEAL_CLOSED, DEAL_OPEN, TASK_CLAIMED, TASK_NONE
from contracts.messages import address_of
from contracts.pricing import locked_stake

from .builders import DEFAULT_PLAN, WINDOW, claim, open_deal, quote, refund, settle_by, signed_task
from .conftest import World

CLOSE_AGREEMENT_LIFE = 2 * WINDOW  # an agreement lapses two challenge windows after it is given
MAX_TASKS = 65_536


# ---------------------------------------------------------------- the stake an open locks


def test_attack_client_opening_for_one_unit_locks_one_unit_of_stake(world: World) -> None:
    client, provider = world.clients[0], world.providers[0]
    world.escrow.deposit(client, 1)
    world.escrow.stake(provider, 10**6)
    q = quote(world, provider, client, max_spend=10**9, stake=10**6)
    result = world.escrow.open_deal(client, q, q.sign(world.escrow.domain, provider), 1)
    deal_id = int(result.event("DealOpened").args["dealId"])
    assert result.event("DealOpened").args["stake"] == 1  # ceil(10**6 * 1 / 10**9)
    assert world.escrow.get_deal(deal_id).stake == 1
    assert world.escrow.stake_of(address_of(provider)) == 10**6 - 1


def test_open_for_the_quotes_whole_spend_locks_the_whole_stake(world: World) -> None:
    deal_id, q = open_deal(world, world.clients[0], world.providers[0], max_spend=10**8)
    full = replace(q, max_spend=10**8)
    assert world.escrow.get_deal(deal_id).stake == locked_stake(q.stake, q.max_spend, 10**8)
    assert locked_stake(full.stake, full.max_spend, 10**8) == full.stake


@pytest.mark.parametrize(
    ("terms", "locked"),
    [
        ((10, 3, 1), 4),
        ((0, 10**9, 10**9), 0),
        ((10**6, 10**9, 0), 0),
        ((2**128 - 1, 2**256 - 1, 2**128 - 1), 1),
        ((2**128 - 1, 2**128 - 1, 2**128 - 1), 2**128 - 1),
        ((2**128 - 1, 2**128, 2**128 - 1), 2**128 - 1),
    ],
)
def test_locked_stake_rounds_up_at_the_extremes_as_the_contract_does(
    deployed: World, terms: tuple[int, int, int], locked: int
) -> None:
    assert locked_stake(*terms) == locked == deployed.escrow.locked_stake(*terms)


@pytest.mark.parametrize(
    ("terms", "error"),
    [
        ((1, 5, 6), "EscrowSpendAboveQuote"),
        ((2**128, 2**200, 1), "EscrowInvalidTerms"),
        ((1, 2**200, 2**128), "EscrowInvalidTerms"),
    ],
)
def test_locked_stake_refuses_what_open_deal_refuses(
    deployed: World, terms: tuple[int, int, int], error: str
) -> None:
    with pytest.raises(ValueError):
        locked_stake(*terms)
    with pytest.raises(getattr(reverts, error)):
        deployed.escrow.locked_stake(*terms)


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.data())
def test_locked_stake_equals_the_contracts_for_any_terms(world: World, data: st.DataObject) -> None:
    # The examples share one snapshot of the chain (reverted after the test): each checks its
    # own open against the provider's free stake just before it.
    client, provider = world.clients[1], world.providers[1]
    quote_stake = data.draw(st.integers(0, 10**12) | st.sampled_from([0, 1, 10**12]))
    quote_max = data.draw(st.integers(1, 2**255) | st.integers(1, 10**6))
    max_spend = data.draw(st.integers(1, min(quote_max, 10**9)))
    world.escrow.deposit(client, max_spend)
    if quote_stake:
        world.escrow.stake(provider, quote_stake)
    free = world.escrow.stake_of(address_of(provider))
    q = quote(world, provider, client, max_spend=quote_max, stake=quote_stake)
    opened = world.escrow.open_deal(client, q, q.sign(world.escrow.domain, provider), max_spend)
    expected = locked_stake(quote_stake, quote_max, max_spend)
    assert opened.event("DealOpened").args["stake"] == expected
    assert world.escrow.get_deal(int(opened.event("DealOpened").args["dealId"])).stake == expected
    assert world.escrow.stake_of(address_of(provider)) == free - expected
    assert world.escrow.locked_stake(quote_stake, quote_max, max_spend) == expected


def test_open_refuses_when_the_free_stake_cannot_cover_the_locked_stake(world: World) -> None:
    client, provider = world.clients[0], world.providers[0]
    world.escrow.deposit(client, 10**6)
    world.escrow.stake(provider, 499)
    q = quote(world, provider, client, max_spend=2 * 10**6, stake=1_000)
    sig = q.sign(world.escrow.domain, provider)
    with pytest.raises(reverts.EscrowInsufficientStake) as info:
        world.escrow.open_deal(client, q, sig, 10**6)
    assert info.value.error_args["needed"] == 500
    world.escrow.stake(provider, 1)
    world.escrow.open_deal(client, q, sig, 10**6)
    assert world.escrow.stake_of(address_of(provider)) == 0


# ---------------------------------------------------------------- a close agreement ends


def test_attack_provider_closing_between_a_breach_and_its_refund_on_an_old_agreement_fails(
    exact_clock: World,
) -> None:
    world = exact_clock
    client, provider = world.clients[0], world.providers[0]
    deal_id, q = open_deal(world, client, provider, max_spend=10_000, duration=3_600)
    world.escrow.close_deal(client, deal_id)  # the client agrees, then goes on working
    agreed_at = world.now()
    world.next_at(agreed_at + CLOSE_AGREEMENT_LIFE + 1)  # views see the latest block's instant
    assert not world.escrow.get_deal(deal_id).client_agreed_close  # lapsed
    task = signed_task(world, deal_id, 0, client, provider, deadline=world.now() + 30)
    world.next_at(task.request.deadline + 1)  # breached; refundable only after settleBy
    attempt = world.escrow.close_deal(provider, deal_id)
    assert [e.name for e in attempt.events] == ["CloseAgreed"]
    assert world.escrow.get_deal(deal_id).status == DEAL_OPEN
    world.next_at(settle_by(task, world.escrow.get_deal(deal_id).expiry, WINDOW) + 1)
    event = refund(world, client, task).event("BreachRefunded").args
    assert (event["refund"], event["penalty"]) == (task.ack.price, q.penalty)
    assert world.escrow.balance_of(address_of(client)) == task.ack.price + q.penalty


def test_close_agreement_is_in_force_until_its_last_second_then_lapses(
    exact_clock: World,
) -> None:
    world = exact_clock
    client, provider = world.clients[0], world.providers[0]
    deal_id, _ = open_deal(world, client, provider, max_spend=10_000)
    other_id, _ = open_deal(world, client, provider, max_spend=10_000)
    world.escrow.close_deal(client, deal_id)
    agreed_at = world.now()
    world.escrow.close_deal(client, other_id)
    world.next_at(agreed_at + CLOSE_AGREEMENT_LIFE - 1)
    deal = world.escrow.get_deal(deal_id)
    assert (deal.client_agreed_close, deal.provider_agreed_close) == (True, False)
    closed = world.escrow.close_deal(provider, deal_id)  # the last second it is in force
    assert [e.name for e in closed.events] == ["CloseAgreed", "DealClosed"]
    world.next_at(agreed_at + 1 + CLOSE_AGREEMENT_LIFE)  # other_id's agreement lapses now
    world.escrow.close_deal(provider, other_id)
    other = world.escrow.get_deal(other_id)
    assert (other.status, other.client_agreed_close, other.provider_agreed_close) == (
        DEAL_OPEN,
        False,
        True,
    )


def test_withdrawn_close_agreement_no_longer_closes_the_deal(world: World) -> None:
    client, provider = world.clients[0], world.providers[0]
    deal_id, _ = open_deal(world, client, provider, max_spend=10_000)
    world.escrow.close_deal(client, deal_id)
    withdrawn = world.escrow.withdraw_close_agreement(client, deal_id)
    assert withdrawn.event("CloseAgreementWithdrawn").args == {
        "dealId": deal_id,
        "party": address_of(client),
    }
    assert not world.escrow.get_deal(deal_id).client_agreed_close
    world.escrow.close_deal(provider, deal_id)
    assert world.escrow.get_deal(deal_id).status == DEAL_OPEN
    world.escrow.withdraw_close_agreement(provider, deal_id)
    assert not world.escrow.get_deal(deal_id).provider_agreed_close
    with pytest.raises(reverts.EscrowUnauthorized):
        world.escrow.withdraw_close_agreement(world.stranger, deal_id)
    world.escrow.close_deal(client, deal_id)
    world.escrow.close_deal(provider, deal_id)
    assert world.escrow.get_deal(deal_id).status == DEAL_CLOSED
    with pytest.raises(reverts.EscrowDealNotOpen):
        world.escrow.withdraw_close_agreement(client, deal_id)


# ---------------------------------------------------------------- indexes past the range


def test_attack_indexes_past_the_range_get_the_typed_error_on_every_path(world: World) -> None:
    client, provider = world.clients[0], world.providers[0]
    deal_id, _ = open_deal(world, client, provider)
    last, past = (
        signed_task(world, deal_id, i, client, provider, deadline=world.now() + 50)
        for i in (MAX_TASKS - 1, MAX_TASKS)
    )
    with pytest.raises(reverts.EscrowTaskIndexTooLarge) as info:
        claim(world, provider, deal_id, [past])
    assert info.value.error_args == {"taskIndex": MAX_TASKS}
    with pytest.raises(reverts.EscrowTaskIndexTooLarge):
        refund(world, client, past)  # before settleBy too: the index, not the time, is wrong
    with pytest.raises(reverts.EscrowTaskIndexTooLarge):
        world.escrow.task_status(deal_id, 2**32 - 1)
    claim(world, provider, deal_id, [last])
    assert world.escrow.task_status(deal_id, MAX_TASKS - 1) == TASK_CLAIMED
    world.anvil.increase_time(50 + WINDOW + 1)
    with pytest.raises(reverts.EscrowTaskIndexTooLarge):
        refund(world, client, past)
    assert world.escrow.task_status(deal_id, 0) == TASK_NONE
    assert (
        world.escrow.price(
            DEFAULT_PLAN, kind=1, status=0, cache_hit=False, device_ms=1, task_index=MAX_TASKS - 1
        )
        == 502
    )
