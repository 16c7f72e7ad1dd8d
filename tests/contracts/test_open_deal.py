"""Opening deals from provider-signed quotes, and replay of signatures across domains."""

from __future__ import annotations

from dataclasses import replace

import pytest

from contracts import reverts
from contracts.binding import DEAL_OPEN
from contracts.messages import SECP256K1_N, Domain, Plan, address_of

from .builders import open_deal, quote
from .conftest import World


def test_open_deal_when_quote_is_valid_then_locks_cap_and_stake(world: World) -> None:
    client, provider = world.clients[0], world.providers[0]
    world.escrow.deposit(client, 10**7)
    world.escrow.stake(provider, 3 * 10**6)
    q = quote(world, provider, client, stake=10**6, penalty=7, max_spend=4 * 10**6)
    result = world.escrow.open_deal(client, q, q.sign(world.escrow.domain, provider), 4 * 10**6)
    deal_id = result.event("DealOpened").args["dealId"]
    deal = world.escrow.get_deal(deal_id)
    assert deal.status == DEAL_OPEN
    assert (deal.client, deal.provider, deal.arbiter) == (
        address_of(client),
        address_of(provider),
        address_of(world.arbiter),
    )
    assert (deal.max_spend, deal.stake, deal.penalty, deal.committed) == (4 * 10**6, 10**6, 7, 0)
    assert deal.expiry == world.now() + q.duration
    assert deal.challenge_window == q.challenge_window
    assert deal.plan_hash == q.plan.struct_hash()
    assert world.escrow.balance_of(address_of(client)) == 6 * 10**6
    assert world.escrow.stake_of(address_of(provider)) == 2 * 10**6
    assert world.escrow.is_nonce_used(address_of(provider), q.nonce)
    assert world.escrow.deal_count() == 1
    assert [e.name for e in result.events] == ["DealOpened"]  # no fee, no ReservationFeePaid


def test_open_deal_when_plan_is_reserved_then_pays_fee_up_front(world: World) -> None:
    provider = world.providers[0]
    plan = Plan(inference_price=100, reservation_fee=25_000, reserved_discount_bps=2_000)
    deal_id, _ = open_deal(world, world.clients[0], provider, plan=plan, max_spend=10**6)
    assert world.escrow.balance_of(address_of(provider)) == 25_000
    assert world.escrow.get_deal(deal_id).committed == 25_000


def test_open_deal_when_quote_expired_then_rejects(world: World) -> None:
    client, provider = world.clients[0], world.providers[0]
    world.escrow.deposit(client, 10**6)
    q = quote(world, provider, client, stake=0, valid_for=5)
    world.anvil.increase_time(10)
    with pytest.raises(reverts.EscrowQuoteExpired):
        world.escrow.open_deal(client, q, q.sign(world.escrow.domain, provider), 10**6)


def test_open_deal_when_quote_names_other_client_then_rejects(world: World) -> None:
    client, provider = world.clients[0], world.providers[0]
    world.escrow.deposit(client, 10**6)
    q = quote(world, provider, world.clients[1], stake=0)
    with pytest.raises(reverts.EscrowWrongClient) as info:
        world.escrow.open_deal(client, q, q.sign(world.escrow.domain, provider), 10**6)
    assert info.value.error_args == {
        "expected": address_of(world.clients[1]),
        "actual": address_of(client),
    }


def test_open_deal_when_one_ask_fills_many_bids_then_each_client_opens_its_own_quote(
    world: World,
) -> None:
    # One ask, two fills: the provider signs one quote per fill, naming that fill's client, with
    # the same terms and its own nonce; both deals open.
    provider = world.providers[0]
    opened = [open_deal(world, c, provider, max_spend=10**6) for c in world.clients[:2]]
    deals = [world.escrow.get_deal(deal_id) for deal_id, _ in opened]
    assert [d.client for d in deals] == [address_of(c) for c in world.clients[:2]]
    assert {d.plan_hash for d in deals} == {opened[0][1].plan.struct_hash()}


@pytest.mark.parametrize(
    ("max_spend", "error"),
    [(0, reverts.EscrowZeroAmount), (10**9 + 1, reverts.EscrowSpendAboveQuote)],
)
def test_open_deal_when_cap_is_zero_or_above_quote_then_rejects(
    world: World, max_spend: int, error: type[Exception]
) -> None:
    client, provider = world.clients[0], world.providers[0]
    world.escrow.deposit(client, 2 * 10**9)
    q = quote(world, provider, client, stake=0, max_spend=10**9)
    with pytest.raises(error):
        world.escrow.open_deal(client, q, q.sign(world.escrow.domain, provider), max_spend)


@pytest.mark.parametrize(
    "plan",
    [
        Plan(cache_hit_discount_bps=10_001),
        Plan(reserved_discount_bps=20_000),
        Plan(tier1_from_task=10, tier1_discount_bps=100, tier2_from_task=5, tier2_discount_bps=200),
    ],
)
def test_open_deal_when_plan_is_invalid_then_rejects(world: World, plan: Plan) -> None:
    client, provider = world.clients[0], world.providers[0]
    world.escrow.deposit(client, 10**6)
    q = quote(world, provider, client, stake=0, plan=plan)
    with pytest.raises(reverts.EscrowInvalidPlan):
        world.escrow.open_deal(client, q, q.sign(world.escrow.domain, provider), 10**6)


@pytest.mark.parametrize(
    "change",
    [
        {"arbiter": "0x" + "00" * 20},
        {"duration": 0},
        {"duration": 2**64 - 1},
        {"challenge_window": 2**63},
        {"stake": 2**128},
        {"penalty": 2**128},
        {"plan": Plan(reservation_fee=10**6 + 1)},
    ],
)
def test_open_deal_when_terms_are_unusable_then_rejects(
    world: World, change: dict[str, object]
) -> None:
    client, provider = world.clients[0], world.providers[0]
    world.escrow.deposit(client, 10**6)
    q = replace(quote(world, provider, client, stake=0), **change)  # type: ignore[arg-type]
    with pytest.raises(reverts.EscrowInvalidTerms):
        world.escrow.open_deal(client, q, q.sign(world.escrow.domain, provider), 10**6)


def test_open_deal_when_signed_by_someone_else_then_rejects(world: World) -> None:
    client, provider = world.clients[0], world.providers[0]
    world.escrow.deposit(client, 10**6)
    q = quote(world, provider, client, stake=0)
    with pytest.raises(reverts.EscrowInvalidSignature):
        world.escrow.open_deal(client, q, q.sign(world.escrow.domain, world.stranger), 10**6)


def test_open_deal_when_signature_is_malleable_then_rejects(world: World) -> None:
    client, provider = world.clients[0], world.providers[0]
    world.escrow.deposit(client, 10**6)
    q = quote(world, provider, client, stake=0)
    sig = q.sign(world.escrow.domain, provider)
    s = int.from_bytes(sig[32:64], "big")
    flipped = sig[:32] + (SECP256K1_N - s).to_bytes(32, "big") + bytes([55 - sig[64]])
    with pytest.raises(reverts.EscrowInvalidSignature):
        world.escrow.open_deal(client, q, flipped, 10**6)
    with pytest.raises(reverts.EscrowInvalidSignature):
        world.escrow.open_deal(client, q, sig[:64], 10**6)
    assert not world.escrow.is_nonce_used(address_of(provider), q.nonce)


def test_open_deal_when_nonce_reused_then_rejects(world: World) -> None:
    client, provider = world.clients[0], world.providers[0]
    _, q = open_deal(world, client, provider, stake=0, max_spend=10**6)
    world.escrow.deposit(client, 10**6)
    with pytest.raises(reverts.EscrowNonceUsed):
        world.escrow.open_deal(client, q, q.sign(world.escrow.domain, provider), 10**6)


def test_cancel_quote_nonce_then_quote_cannot_open_a_deal(world: World) -> None:
    client, provider = world.clients[0], world.providers[0]
    world.escrow.deposit(client, 10**6)
    q = quote(world, provider, client, stake=0)
    result = world.escrow.cancel_quote_nonce(provider, q.nonce)
    assert result.event("QuoteNonceCancelled").args["nonce"] == q.nonce
    with pytest.raises(reverts.EscrowNonceUsed):
        world.escrow.open_deal(client, q, q.sign(world.escrow.domain, provider), 10**6)
    with pytest.raises(reverts.EscrowNonceUsed):
        world.escrow.cancel_quote_nonce(provider, q.nonce)


def test_open_deal_when_client_balance_short_then_rejects(world: World) -> None:
    client, provider = world.clients[0], world.providers[0]
    world.escrow.deposit(client, 10)
    q = quote(world, provider, client, stake=0)
    with pytest.raises(reverts.EscrowInsufficientBalance):
        world.escrow.open_deal(client, q, q.sign(world.escrow.domain, provider), 11)


def test_open_deal_when_provider_stake_short_then_rejects(world: World) -> None:
    client, provider = world.clients[0], world.providers[0]
    world.escrow.deposit(client, 10**6)
    q = quote(world, provider, client, stake=10**6, max_spend=10**6)
    with pytest.raises(reverts.EscrowInsufficientStake):
        world.escrow.open_deal(client, q, q.sign(world.escrow.domain, provider), 10**6)


def test_quote_when_signed_for_other_chain_then_rejects(world: World) -> None:
    client, provider = world.clients[0], world.providers[0]
    world.escrow.deposit(client, 10**6)
    q = quote(world, provider, client, stake=0)
    other_chain = Domain(chain_id=1, verifying_contract=world.escrow.address)
    with pytest.raises(reverts.EscrowInvalidSignature):
        world.escrow.open_deal(client, q, q.sign(other_chain, provider), 10**6)


def test_quote_when_signed_for_other_escrow_then_rejects(world: World) -> None:
    client, provider = world.clients[0], world.providers[0]
    other = world.chain.escrow(world.chain.deploy(world.deployer).escrow)
    world.escrow.deposit(client, 10**6)
    q = quote(world, provider, client, stake=0)
    with pytest.raises(reverts.EscrowInvalidSignature):
        world.escrow.open_deal(client, q, q.sign(other.domain, provider), 10**6)


def test_get_deal_when_unknown_then_rejects(world: World) -> None:
    with pytest.raises(reverts.EscrowDealNotFound):
        world.escrow.get_deal(999)
