"""The arbiter's fee: fixed per deal when it opens, held from the disputing client's free
balance, paid by the side that loses the ruling (the provider from the deal's stake left after
the penalty), never paid on a lapse; a stateful machine shows fees never create or lose money."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from contracts import reverts
from contracts.messages import address_of
from tests import chain_clock

from .builders import claim, open_deal, signed_task
from .conftest import ARBITRATION_PERIOD, World

FEE = 20_000
MAX_SPEND = 10**8
STAKE = 10**6
PENALTY = 50_000
EXAMPLES, STEPS = 8, 10
PHASES = (Phase.explicit, Phase.generate)  # no shrinking: each step is a chain transaction


def _batch(world: World, deal_id: int, first: int, count: int = 2) -> int:
    client, provider = world.clients[0], world.providers[0]
    tasks = [signed_task(world, deal_id, first + i, client, provider) for i in range(count)]
    result = claim(world, provider, deal_id, tasks)
    return int(result.event("ReceiptsClaimed").args["batchId"])


def _deal(world: World, *, deposit: int = MAX_SPEND + 3 * FEE, stake: int = STAKE) -> int:
    deal_id, _ = open_deal(
        world,
        world.clients[0],
        world.providers[0],
        max_spend=MAX_SPEND,
        deposit=deposit,
        stake=stake,
        penalty=PENALTY,
    )
    return deal_id


def test_a_deal_keeps_the_fee_in_force_when_it_opened(world: World) -> None:
    e, arbiter = world.escrow, world.arbiter
    result = e.set_arbiter_fee(arbiter, FEE)
    assert result.event("ArbiterFeeSet").args["fee"] == FEE
    deal_id = _deal(world)
    e.set_arbiter_fee(arbiter, 5 * FEE)
    assert e.arbiter_fee(address_of(arbiter)) == 5 * FEE
    assert e.deal_arbiter_fee(deal_id) == (FEE, 0)


def test_client_that_loses_the_ruling_pays_the_fee_it_held(world: World) -> None:
    e, client, arbiter = world.escrow, world.clients[0], world.arbiter
    e.set_arbiter_fee(arbiter, FEE)
    deal_id = _deal(world)
    batch = _batch(world, deal_id, 0)
    free = e.balance_of(address_of(client))
    e.dispute_claim(client, deal_id, batch)
    assert e.balance_of(address_of(client)) == free - FEE
    assert e.deal_arbiter_fee(deal_id) == (FEE, FEE)
    result = e.resolve_dispute(arbiter, deal_id, batch, True)
    paid = result.event("ArbiterFeePaid").args
    assert (paid["payer"], paid["fee"]) == (address_of(client), FEE)
    assert e.balance_of(address_of(arbiter)) == FEE
    assert e.balance_of(address_of(client)) == free - FEE
    assert e.deal_arbiter_fee(deal_id) == (FEE, 0)


def test_provider_that_loses_the_ruling_pays_the_fee_from_the_stake_after_the_penalty(
    world: World,
) -> None:
    e, client, arbiter = world.escrow, world.clients[0], world.arbiter
    e.set_arbiter_fee(arbiter, FEE)
    deal_id = _deal(world)
    batch = _batch(world, deal_id, 0, count=2)
    free = e.balance_of(address_of(client))
    e.dispute_claim(client, deal_id, batch)
    result = e.resolve_dispute(arbiter, deal_id, batch, False)
    ended = result.event("DisputeResolved").args
    paid = result.event("ArbiterFeePaid").args
    assert (paid["payer"], paid["fee"]) == (address_of(world.providers[0]), FEE)
    assert ended["penalty"] == 2 * PENALTY
    # The client's held fee comes back with the refund and the penalty.
    assert e.balance_of(address_of(client)) == free + ended["refund"] + 2 * PENALTY
    assert e.balance_of(address_of(arbiter)) == FEE
    assert e.get_deal(deal_id).stake == STAKE - 2 * PENALTY - FEE


def test_the_fee_is_capped_by_the_stake_left_after_the_penalty(world: World) -> None:
    e, client, arbiter = world.escrow, world.clients[0], world.arbiter
    e.set_arbiter_fee(arbiter, FEE)
    stake = 2 * PENALTY + FEE // 4
    deal_id = _deal(world, stake=stake)
    batch = _batch(world, deal_id, 0, count=2)
    e.dispute_claim(client, deal_id, batch)
    result = e.resolve_dispute(arbiter, deal_id, batch, False)
    assert result.event("ArbiterFeePaid").args["fee"] == FEE // 4
    assert e.get_deal(deal_id).stake == 0
    assert e.balance_of(address_of(arbiter)) == FEE // 4


def test_a_lapsed_dispute_pays_no_fee_and_returns_the_clients(world: World) -> None:
    e, client, arbiter = world.escrow, world.clients[0], world.arbiter
    e.set_arbiter_fee(arbiter, FEE)
    deal_id = _deal(world)
    batch = _batch(world, deal_id, 0)
    free = e.balance_of(address_of(client))
    e.dispute_claim(client, deal_id, batch)
    world.anvil.increase_time(ARBITRATION_PERIOD + 1)
    result = e.lapse_dispute(world.stranger, deal_id, batch)
    ended = result.event("DisputeResolved").args
    assert e.balance_of(address_of(arbiter)) == 0
    assert e.balance_of(address_of(client)) == free + ended["refund"] + ended["penalty"]
    assert e.deal_arbiter_fee(deal_id) == (FEE, 0)


def test_a_client_without_the_fee_free_cannot_dispute(world: World) -> None:
    e, client, arbiter = world.escrow, world.clients[0], world.arbiter
    e.set_arbiter_fee(arbiter, FEE)
    deal_id = _deal(world, deposit=MAX_SPEND)
    batch = _batch(world, deal_id, 0)
    assert e.balance_of(address_of(client)) == 0
    with pytest.raises(reverts.EscrowInsufficientBalance):
        e.dispute_claim(client, deal_id, batch)


class FeeMachine(RuleBasedStateMachine):
    """Deals under changing fees, batches claimed, disputed, ruled either way or lapsed."""

    world: World

    def __init__(self) -> None:
        super().__init__()
        self.snapshot = self.world.anvil.snapshot()
        self.deals: list[int] = []
        self.next_task: dict[int, int] = {}
        self.pending: list[tuple[int, int]] = []
        self.disputed: list[tuple[int, int]] = []
        self.fees_paid = 0

    def teardown(self) -> None:
        chain_clock.revert(self.world.anvil, self.snapshot)  # the clock too
        self.world.chain.tx.reset_nonces()

    @initialize(fee=st.integers(0, 10 * FEE))
    def open_a_deal(self, fee: int) -> None:
        self.world.escrow.set_arbiter_fee(self.world.arbiter, fee)
        self._open()

    def _open(self) -> None:
        deal_id = _deal(self.world, deposit=MAX_SPEND + 4 * FEE)
        self.deals.append(deal_id)
        self.next_task[deal_id] = 0

    @rule(fee=st.integers(0, 10 * FEE))
    def set_fee_and_open(self, fee: int) -> None:
        self.world.escrow.set_arbiter_fee(self.world.arbiter, fee)
        self._open()

    @rule(which=st.integers(0, 7), count=st.integers(1, 3))
    def provider_claims(self, which: int, count: int) -> None:
        deal_id = self.deals[which % len(self.deals)]
        batch = _batch(self.world, deal_id, self.next_task[deal_id], count)
        self.next_task[deal_id] += count
        self.pending.append((deal_id, batch))

    @precondition(lambda self: bool(self.pending))
    @rule(which=st.integers(0, 7))
    def client_disputes(self, which: int) -> None:
        deal_id, batch = self.pending.pop(which % len(self.pending))
        e, client = self.world.escrow, self.world.clients[0]
        fee, _ = e.deal_arbiter_fee(deal_id)
        if e.balance_of(address_of(client)) < fee:
            with pytest.raises(reverts.EscrowInsufficientBalance):
                e.dispute_claim(client, deal_id, batch)
            self.pending.append((deal_id, batch))
            return
        e.dispute_claim(client, deal_id, batch)
        self.disputed.append((deal_id, batch))

    @precondition(lambda self: bool(self.disputed))
    @rule(which=st.integers(0, 7), provider_wins=st.booleans())
    def arbiter_rules(self, which: int, provider_wins: bool) -> None:
        deal_id, batch = self.disputed.pop(which % len(self.disputed))
        result = self.world.escrow.resolve_dispute(
            self.world.arbiter, deal_id, batch, provider_wins
        )
        paid = [e.args["fee"] for e in result.events if e.name == "ArbiterFeePaid"]
        self.fees_paid += sum(paid)

    @precondition(lambda self: bool(self.disputed))
    @rule()
    def all_disputes_lapse(self) -> None:
        self.world.anvil.increase_time(ARBITRATION_PERIOD + 1)
        for deal_id, batch in self.disputed:
            result = self.world.escrow.lapse_dispute(self.world.stranger, deal_id, batch)
            assert all(e.name != "ArbiterFeePaid" for e in result.events)
        self.disputed.clear()
        self.pending.clear()  # their challenge windows have closed too

    @invariant()
    def fees_never_create_or_lose_money(self) -> None:
        w = self.world
        e = w.escrow
        actors = [*w.clients, *w.providers, w.arbiter, w.stranger]
        free = sum(e.balance_of(address_of(k)) for k in actors)
        stakes = sum(e.stake_of(address_of(k)) for k in actors)
        locked = 0
        held_total = 0
        for deal_id in self.deals:
            deal = e.get_deal(deal_id)
            fee, held = e.deal_arbiter_fee(deal_id)
            disputes = sum(1 for d, _ in self.disputed if d == deal_id)
            assert held == fee * disputes, "a deal holds other than one fee per open dispute"
            locked += deal.max_spend - deal.committed + deal.stake
            held_total += held
        assert w.token.balance_of(e.address) == free + stakes + locked + held_total
        assert e.balance_of(address_of(w.arbiter)) == self.fees_paid


def test_fees_never_create_or_lose_money(world: World) -> None:
    FeeMachine.world = world
    run_state_machine_as_test(
        FeeMachine,
        settings=settings(
            max_examples=EXAMPLES,
            stateful_step_count=STEPS,
            phases=PHASES,
            deadline=None,
            suppress_health_check=list(HealthCheck),
            derandomize=True,
        ),
    )
