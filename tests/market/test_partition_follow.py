"""Market processes sharing one PostgreSQL database index the chain once between them
(`market.follower`): two markets of different device classes on one schema and one real
anvil escrow, their chain jobs run by hand.

Properties: the process that does not index reads again, one run after the indexer stored the
event, the figure of an account whose withdrawal the other process indexed (not after its cache
lapses); and when the indexing process stops, the other takes the indexer lock on its next run
and indexes from where the index stood, so a deposit made after the stop is seen.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from market.follower import ChainFollow
from market.indexer import Indexer
from market.models import HeartbeatCreate, OrderCreate
from market.service import MarketService
from market.settings import Settings

from . import chain as fixtures
from .chain import ChainWorld
from .conftest import Clock
from .signing import Trader

chain_session = fixtures.chain_session
world = fixtures.world

A, B = "tpu-follow-a", "tpu-follow-b"
PRICE = 100


@pytest.fixture
def pair(
    world: ChainWorld, pg: str, tmp_path: Path
) -> Iterator[tuple[MarketService, MarketService]]:
    """Two markets on one schema: the first of class A (it takes the indexer lock), the
    second of class B."""
    services = []
    for name, device_class in (("a", A), ("b", B)):
        settings = Settings(
            data_dir=tmp_path / name,
            database_url=pg,
            chain_id=world.anvil.chain_id,
            escrow=world.escrow.address,
            rpc_url=world.anvil.url,
            run_jobs=False,
            device_classes=device_class,
        )
        services.append(MarketService(settings, clock=Clock(world.now())))
    yield services[0], services[1]
    for service in services:
        service.close()


def _job(world: ChainWorld, service: MarketService) -> ChainFollow:
    return ChainFollow(
        service,
        lambda: Indexer(service, rpc_url=world.anvil.url, escrow=world.escrow.address),
    )


def _bid_in_b(world: ChainWorld, b: MarketService, client: Trader, provider: Trader) -> None:
    """A staked provider heartbeats class B; the client's funded bid rests there."""
    world.escrow.stake(provider.key, b.settings.min_provider_stake)
    beat = provider.heartbeat(b.now(), device_class=B)
    b.heartbeat(HeartbeatCreate.model_validate(beat), beat["advert"])
    world.escrow.deposit(client.key, 10 * PRICE)
    body = client.bid(b.now(), price=PRICE, quantity=1, device_class=B)
    b.place([OrderCreate.model_validate(body)])


def test_the_process_that_does_not_index_reads_a_withdrawal_one_run_after_it_is_indexed(
    world: ChainWorld, pair: tuple[MarketService, MarketService]
) -> None:
    a, b = pair
    assert a.partition.indexes and not b.partition.indexes
    job_a, job_b = _job(world, a), _job(world, b)
    client, provider = world.trader(world.clients[0]), world.trader(world.providers[0])
    job_a.run_once()
    job_b.run_once()  # b follows from the index as it stands
    _bid_in_b(world, b, client, provider)
    kept = b.funds.balances.cached(client.address)
    assert kept == world.escrow.balance_of(client.address)
    world.escrow.withdraw(client.key, 5 * PRICE)
    job_b.run_once()  # not indexed yet: nothing to follow
    assert b.funds.balances.cached(client.address) == kept
    job_a.run_once()  # a indexes the withdrawal
    job_b.run_once()  # b follows: the client holds a live bid there, so its balance is read
    assert b.funds.balances.cached(client.address) == kept - 5 * PRICE
    assert not b.partition.indexes and job_b.took_over == 0


def test_when_the_indexing_process_stops_the_other_takes_over_and_indexes_on(
    world: ChainWorld, pair: tuple[MarketService, MarketService]
) -> None:
    a, b = pair
    job_a, job_b = _job(world, a), _job(world, b)
    client, provider = world.trader(world.clients[0]), world.trader(world.providers[0])
    job_a.run_once()
    job_b.run_once()
    _bid_in_b(world, b, client, provider)
    job_a.run_once()
    indexed = job_a.indexer.indexed_block()
    a.close()  # its connection, and the indexer lock with it, are gone
    world.escrow.deposit(client.key, 7 * PRICE)
    kept = b.funds.balances.cached(client.address)
    job_b.run_once()  # takes the lock and indexes from where the index stood
    assert b.partition.indexes and job_b.took_over == 1
    assert indexed is not None and (job_b.indexer.indexed_block() or 0) > indexed
    assert kept is not None
    assert b.funds.balances.cached(client.address) == kept + 7 * PRICE
    assert b.funds.balances.ttl == float("inf")  # kept until an indexed event moves it
