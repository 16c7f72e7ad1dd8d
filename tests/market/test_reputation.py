"""Reputation costs at least what it shows (P6): value paid on chain by distinct clients,
refunds and penalties, from a real v2 escrow's events; never voucher task bits."""

from __future__ import annotations

import os
from typing import Any

from contracts.binding import TASK_VOUCHED
from contracts.messages import Plan, Quote, Voucher, address_of, task_bitmap
from market import chain_index
from market.indexer import Indexer
from market.models import HeartbeatCreate, ProviderPublic
from market.presenters import reliability
from market.service import MarketService

from . import chain as fixtures
from .chain import MIN_WINDOW, ChainWorld, ack_of, claim_of, task_request
from .signing import Trader

chain_session = fixtures.chain_session
world = fixtures.world
market = fixtures.market

ALL_TASKS = (2**256 - 1,) * 256  # every bit of every word: tasks 0 to 65,535


def _register(world: ChainWorld, service: MarketService, provider: Trader) -> None:
    """Stake the market's minimum (a provider registers only with stake), then advertise."""
    world.escrow.stake(provider.key, service.settings.min_provider_stake)
    body = provider.heartbeat(service.now())
    service.heartbeat(HeartbeatCreate.model_validate(body), body["advert"])


def _entry(service: MarketService, provider: Trader) -> ProviderPublic:
    return next(p for p in service.providers() if p.address == provider.address)


def _open(
    world: ChainWorld, provider: Trader, client_key: str, max_spend: int, **terms: Any
) -> tuple[int, Quote]:
    """Open a deal straight on chain with a quote naming `client_key` (no market involved)."""
    quote = provider.quote(
        slo_ms=100,
        valid_until=world.now() + 600,
        client=address_of(client_key),
        challenge_window=MIN_WINDOW,
        max_spend=max_spend,
        **terms,
    )
    world.escrow.deposit(client_key, max_spend)
    if quote.stake:
        world.escrow.stake(provider.key, quote.stake)
    signature = quote.sign(world.escrow.domain, provider.key)
    opened = world.escrow.open_deal(client_key, quote, signature, max_spend)
    return int(opened.event("DealOpened").args["dealId"]), quote


def _pay(
    world: ChainWorld, provider: Trader, client_key: str, deal: int, amount: int, tasks: object
) -> None:
    v = Voucher(deal_id=deal, cumulative_amount=amount, tasks=tasks)  # type: ignore[arg-type]
    world.escrow.redeem_voucher(provider.key, v, v.sign(world.escrow.domain, client_key))


def test_reputation_when_provider_self_pays_a_65536_task_voucher_then_one_unit_from_one_client(
    world: ChainWorld, market: MarketService
) -> None:
    provider = world.trader(world.providers[0])
    _register(world, market, provider)
    throwaway = "0x" + os.urandom(32).hex()
    world.fund(throwaway)
    deal, _ = _open(world, provider, throwaway, 1, stake=0, penalty=0)
    _pay(world, provider, throwaway, deal, 1, ALL_TASKS)
    assert world.escrow.task_status(deal, 65_535) == TASK_VOUCHED  # the chain marks them all

    Indexer(market, rpc_url=world.anvil.url, escrow=world.escrow.address).run_once()
    entry = _entry(market, provider)
    assert (entry.paid, entry.clients, entry.top_client_share) == ("1", 1, 1.0)
    assert (entry.refunded, entry.penalties, entry.refunds) == ("0", "0", 0)
    prior = market.settings.reputation_prior
    assert entry.reliability == round((1 + prior) / (1 + 2 * prior), 4) == 0.5
    assert "65536" not in entry.model_dump_json()
    with market.session() as session:  # the deal itself still says what the chain says
        row = chain_index.get_chain_deal(session=session, chain_deal_id=deal)
        assert row is not None and row.tasks_paid == 65_536 and row.paid == "1"


def test_reputation_when_value_comes_from_one_client_then_the_breakdown_shows_it(
    world: ChainWorld, market: MarketService
) -> None:
    """Two providers each paid 10,000: one by two clients, one by a client it funded."""
    honest, faker = world.trader(world.providers[0]), world.trader(world.providers[1])
    for provider in (honest, faker):
        _register(world, market, provider)
    for client in world.clients[:2]:
        deal, _ = _open(world, honest, client, 5_000)
        _pay(world, honest, client, deal, 5_000, task_bitmap(range(5)))
    throwaway = "0x" + os.urandom(32).hex()
    world.fund(throwaway)
    deal, _ = _open(world, faker, throwaway, 10_000)
    _pay(world, faker, throwaway, deal, 10_000, ALL_TASKS)

    Indexer(market, rpc_url=world.anvil.url, escrow=world.escrow.address).run_once()
    good, fake = _entry(market, honest), _entry(market, faker)
    assert (good.paid, good.clients, good.top_client_share) == ("10000", 2, 0.5)
    assert (fake.paid, fake.clients, fake.top_client_share) == ("10000", 1, 1.0)
    with market.session() as session:
        pairs = chain_index.provider_clients(session=session, providers=[honest.address])
    assert sorted((p.client, p.paid, p.deals) for p in pairs[honest.address]) == sorted(
        (address_of(c), "5000", 1) for c in world.clients[:2]
    )


def test_reputation_counts_claims_disputes_refunds_and_penalties_by_value(
    world: ChainWorld, market: MarketService
) -> None:
    provider, client = world.trader(world.providers[2]), world.clients[2]
    _register(world, market, provider)
    plan = Plan(inference_price=500, reservation_fee=300, reserved_discount_bps=0)
    deal, _ = _open(world, provider, client, 100_000, plan=plan, penalty=7_000, stake=100_000)
    deadline = world.now() + 40
    requests = [task_request(deal, i, deadline=deadline) for i in range(5)]
    escrow = world.escrow

    def claim(*indexes: int) -> int:
        claims = [claim_of(world, requests[i], plan, client) for i in indexes]
        done = escrow.claim_receipts(provider.key, deal, plan, claims)
        return int(done.event("ReceiptsClaimed").args["batchId"])

    first = claim(0, 1)  # undisputed: paid after the window
    world.anvil.increase_time(MIN_WINDOW + 1)
    escrow.finalize_claim(provider.key, deal, first)
    won = claim(2)  # disputed, ruled for the provider
    escrow.dispute_claim(client, deal, won)
    escrow.resolve_dispute(world.arbiter, deal, won, True)
    lost = claim(3)  # disputed, ruled for the client: refund and penalty
    escrow.dispute_claim(client, deal, lost)
    escrow.resolve_dispute(world.arbiter, deal, lost, False)
    ack = ack_of(requests[4], 500)  # acked, never delivered: refunded after settleBy
    world.anvil.increase_time(deadline + MIN_WINDOW + 1 - world.now())
    escrow.refund_breach(client, requests[4], ack, ack.sign(escrow.domain, provider.key))

    Indexer(market, rpc_url=world.anvil.url, escrow=escrow.address).run_once()
    entry = _entry(market, provider)
    assert (entry.paid, entry.clients) == ("1500", 1)  # 2 finalized + 1 won; not the 300 fee
    assert (entry.refunded, entry.penalties) == ("1000", "14000")
    assert (entry.refunds, entry.disputes_won, entry.disputes_lost) == (1, 1, 1)
    prior = market.settings.reputation_prior
    expected = reliability(paid=1_500, refunded=1_000, penalties=14_000, prior=prior)
    assert entry.reliability == round(expected, 4) < 0.5
    with market.session() as session:
        row = chain_index.get_chain_deal(session=session, chain_deal_id=deal)
        assert row is not None
        assert (row.tasks_claimed, row.tasks_paid, row.reservation_fee) == (4, 3, "300")
        assert (row.paid, row.refunded, row.penalties) == ("1500", "1000", "14000")
    state = escrow.get_deal(deal)  # the chain agrees: committed = fee + paid + refunds
    assert state.committed == 300 + 1_500 + 1_000
