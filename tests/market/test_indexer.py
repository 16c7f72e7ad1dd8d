"""The chain indexer against a real anvil with real escrow events."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from contracts.chain import free_port
from contracts.messages import Quote, address_of
from market.indexer import Indexer
from market.models import OrderCreate, QuoteAttach
from market.service import MarketService, Settings
from tests.contracts import conftest as contracts_fixtures
from tests.contracts.builders import ack, voucher
from tests.contracts.conftest import World

from .conftest import Clock
from .signing import Trader

# The contracts tests' fixtures: one anvil and deployment per session, reverted per test.
anvil = contracts_fixtures.anvil
deployed = contracts_fixtures.deployed
world = contracts_fixtures.world


@pytest.fixture
def chain_world(world: World) -> World:
    """The contracts tests' deployed world, reverted after each test."""
    return world


@pytest.fixture
def market(chain_world: World, tmp_path: Path) -> Iterator[tuple[MarketService, Settings, Clock]]:
    world = chain_world
    settings = Settings(
        data_dir=tmp_path / "data",
        chain_id=world.anvil.chain_id,
        escrow=world.escrow.address,
        run_jobs=False,
    )
    clock = Clock(world.now())
    service = MarketService(settings, clock=clock)
    yield service, settings, clock
    service.close()


def _trader(w: World, key: str) -> Trader:
    return Trader(
        key=key, chain_id=w.anvil.chain_id, escrow=w.escrow.address, arbiter=address_of(w.arbiter)
    )


def _match(w: World, service: MarketService, now: int) -> tuple[str, Quote, bytes]:
    client, provider = _trader(w, w.clients[0]), _trader(w, w.providers[0])
    service.place([OrderCreate.model_validate(provider.ask(now, price=1_000, quantity=10))])
    [result] = service.place([OrderCreate.model_validate(client.bid(now, price=1_000))])
    deal = service.deal(result.fills[0].id)
    assert deal.quote is not None and deal.quote_signature is not None
    return deal.deal_id, Quote.from_json(deal.quote), bytes.fromhex(deal.quote_signature[2:])


def test_indexer_follows_deal_from_open_to_close_and_scores_provider(
    chain_world: World,
    market: tuple[MarketService, Settings, Clock],
) -> None:
    world = chain_world
    service, settings, clock = market
    client, provider = world.clients[0], world.providers[0]
    deal_id, quote, quote_signature = _match(world, service, int(clock.now))
    indexer = Indexer(service, rpc_url=world.anvil.url, escrow=world.escrow.address)
    assert indexer.run_once() == 0

    world.escrow.deposit(client, 10_000)
    world.escrow.stake(provider, quote.stake)
    opened = world.escrow.open_deal(client, quote, quote_signature, 10_000)
    chain_deal = int(opened.event("DealOpened").args["dealId"])
    assert indexer.run_once() == 3  # Deposited, Staked, DealOpened
    record = service.deal(deal_id)
    assert (record.status, record.chain_deal_id, record.opened_tx) == (
        "opened",
        chain_deal,
        opened.tx_hash,
    )

    v = voucher(chain_deal, 1_500, [0, 1, 2])
    paid = world.escrow.redeem_voucher(provider, v, v.sign(world.escrow.domain, client))
    a = ack(chain_deal, 3, deadline=world.now() + 10, price=500)
    world.anvil.increase_time(10 + quote.challenge_window + 1)
    refund = world.escrow.refund_breach(client, a, a.sign(world.escrow.domain, provider))
    assert indexer.run_once() == 2
    record = service.deal(deal_id)
    assert (record.status, record.tasks_paid, record.paid, record.refunds) == ("paid", 3, "1500", 1)
    assert record.last_tx == refund.tx_hash and paid.tx_hash != refund.tx_hash
    outcomes = service.deals(party=address_of(provider), limit=5)
    assert outcomes[0].refunded == "500"

    # Restart: a new service and indexer on the same database resume after the last block.
    service.close()
    restarted = MarketService(settings, clock=clock)
    again = Indexer(restarted, rpc_url=world.anvil.url, escrow=world.escrow.address)
    assert again.indexed_block() == indexer.indexed_block()
    assert again.run_once() == 0
    world.escrow.close_deal(client, chain_deal)
    closed = world.escrow.close_deal(provider, chain_deal)
    assert again.run_once() == 3  # CloseAgreed by each party, then DealClosed
    record = restarted.deal(deal_id)
    assert (record.status, record.closed_tx, record.tasks_paid) == ("closed", closed.tx_hash, 3)
    restarted.close()


def test_indexer_when_rpc_down_then_retries_and_catches_up(
    chain_world: World,
    market: tuple[MarketService, Settings, Clock],
) -> None:
    world = chain_world
    service, _, clock = market
    client, provider = world.clients[0], world.providers[0]
    _deal_id, quote, quote_signature = _match(world, service, int(clock.now))
    world.escrow.deposit(client, 10_000)
    world.escrow.stake(provider, quote.stake)
    world.escrow.open_deal(client, quote, quote_signature, 10_000)

    indexer = Indexer(
        service, rpc_url=f"http://127.0.0.1:{free_port()}", escrow=world.escrow.address
    )
    assert indexer.run_once() == 0  # nobody answers: recorded, not raised
    assert indexer.last_error is not None and indexer.indexed_block() is None
    indexer.rpc_url = world.anvil.url  # the endpoint comes back
    assert indexer.run_once() == 3  # Deposited, Staked, DealOpened
    assert indexer.last_error is None


def test_reliability_counts_verified_outcomes_only(
    chain_world: World,
    market: tuple[MarketService, Settings, Clock],
) -> None:
    world = chain_world
    service, _, clock = market
    client, provider_key = world.clients[0], world.providers[0]
    _deal_id, quote, quote_signature = _match(world, service, int(clock.now))
    provider = _trader(world, provider_key)
    from market.models import HeartbeatCreate

    body = provider.heartbeat(int(clock.now), throughput=1e9)  # claims are not scored
    service.heartbeat(HeartbeatCreate.model_validate(body), body["advert"])
    world.escrow.deposit(client, 10_000)
    world.escrow.stake(provider_key, quote.stake)
    opened = world.escrow.open_deal(client, quote, quote_signature, 10_000)
    chain_deal = int(opened.event("DealOpened").args["dealId"])
    v = voucher(chain_deal, 1_000, [0, 1])
    world.escrow.redeem_voucher(provider_key, v, v.sign(world.escrow.domain, client))
    a = ack(chain_deal, 2, deadline=world.now() + 10, price=500)
    world.anvil.increase_time(10 + quote.challenge_window + 1)
    world.escrow.refund_breach(client, a, a.sign(world.escrow.domain, provider_key))
    Indexer(service, rpc_url=world.anvil.url, escrow=world.escrow.address).run_once()
    [entry] = service.providers()
    assert (entry.tasks_paid, entry.refunds, entry.disputes_lost) == (2, 1, 0)
    assert entry.reliability == round(3 / 5, 4)


def test_indexer_when_one_ask_fills_two_clients_then_each_opens_its_own_deal(
    chain_world: World,
    market: tuple[MarketService, Settings, Clock],
) -> None:
    world = chain_world
    service, _, clock = market
    now = int(clock.now)
    provider = _trader(world, world.providers[0])
    first, second = (_trader(world, key) for key in world.clients[:2])
    service.place([OrderCreate.model_validate(provider.ask(now, price=1_000, quantity=10))])
    deals = []
    for client in (first, second):
        body = client.bid(now, price=1_000, quantity=4)
        [placed] = service.place([OrderCreate.model_validate(body)])
        deals.append(placed.fills[0].id)
    fresh = provider.quote(slo_ms=100, valid_until=now + 600, arbiter=address_of(world.arbiter))
    service.attach_quote(
        deals[1],
        QuoteAttach.model_validate(
            {
                "quote": fresh.to_json(),
                "quote_signature": "0x" + fresh.sign(world.escrow.domain, provider.key).hex(),
            }
        ),
    )
    world.escrow.stake(provider.key, 2 * fresh.stake)
    opened = []
    for client, deal_id in zip((first, second), deals, strict=True):
        record = service.deal(deal_id)
        assert record.quote is not None and record.quote_signature is not None
        quote = Quote.from_json(record.quote)
        world.escrow.deposit(client.key, 10_000)
        tx = world.escrow.open_deal(
            client.key, quote, bytes.fromhex(record.quote_signature[2:]), 10_000
        )
        opened.append(int(tx.event("DealOpened").args["dealId"]))
    Indexer(service, rpc_url=world.anvil.url, escrow=world.escrow.address).run_once()
    assert [service.deal(d).chain_deal_id for d in deals] == opened
    assert [service.deal(d).status for d in deals] == ["opened", "opened"]


def test_indexer_when_from_block_given_then_skips_earlier_history(
    chain_world: World,
    market: tuple[MarketService, Settings, Clock],
) -> None:
    world = chain_world
    service, _, _ = market
    world.escrow.deposit(world.clients[0], 10_000)
    head = int(world.chain.w3.eth.block_number)
    indexer = Indexer(
        service, rpc_url=world.anvil.url, escrow=world.escrow.address, from_block=head + 1
    )
    assert indexer.run_once() == 0
    world.escrow.deposit(world.clients[0], 5_000)
    assert indexer.run_once() == 1
    assert indexer.indexed_block() == head + 1
