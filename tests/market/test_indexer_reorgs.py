"""The chain indexer under reorgs on a real anvil that keeps its history (`anvil_reorg`): a
reorg that replaces indexed blocks is seen at the next run and the index is rebuilt from the
canonical chain (no event of the lost blocks stays, the new ones are there); with confirmations
at least the reorg's depth the indexer never reads the blocks a reorg replaces."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from sqlmodel import select

from contracts.chain import Anvil, rpc
from market.indexer import Indexer
from market.models import ChainEvent
from market.service import MarketService

from . import chain as fixtures
from .chain import ChainWorld, deploy_world


@pytest.fixture
def world() -> Iterator[ChainWorld]:
    with Anvil.start(accounts=10, keep_history=True) as anvil:
        yield deploy_world(anvil)


market = fixtures.market  # the market on this module's chain (its `world`)


def _events(market: MarketService) -> list[tuple[str, str]]:
    with market.session() as session:
        rows = session.exec(select(ChainEvent)).all()
        return sorted((row.name, row.tx_hash) for row in rows)


def _indexer(world: ChainWorld, market: MarketService, confirmations: int = 0) -> Indexer:
    return Indexer(
        market,
        rpc_url=world.anvil.url,
        escrow=world.escrow.address,
        from_block=world.deploy_block,
        confirmations=confirmations,
    )


def test_a_reorg_under_indexed_blocks_rebuilds_the_index_from_the_canonical_chain(
    world: ChainWorld, market: MarketService
) -> None:
    indexer = _indexer(world, market)
    kept = world.escrow.deposit(world.clients[0], 5)
    lost = world.escrow.deposit(world.clients[1], 7)
    assert indexer.run_once() == 2
    assert {tx for _, tx in _events(market)} == {kept.tx_hash, lost.tx_hash}
    rpc(world.anvil.url, "anvil_reorg", [1, []])  # the block of the second deposit is replaced
    world.chain.tx.reset_nonces()
    replacement = world.escrow.deposit(world.clients[2], 9)
    indexer.run_once()
    assert indexer.reorgs == 1
    assert {tx for _, tx in _events(market)} == {kept.tx_hash, replacement.tx_hash}
    assert indexer.indexed_block() == world.chain.w3.eth.block_number
    assert indexer.run_once() == 0 and indexer.reorgs == 1  # the rebuilt index holds


def test_with_confirmations_a_shallower_reorg_never_reaches_the_index(
    world: ChainWorld, market: MarketService
) -> None:
    indexer = _indexer(world, market, confirmations=2)
    first = world.escrow.deposit(world.clients[0], 5)
    for _ in range(2):
        rpc(world.anvil.url, "evm_mine")
    assert indexer.run_once() == 1  # the deposit is 2 blocks deep now
    lost = world.escrow.deposit(world.clients[1], 7)
    assert indexer.run_once() == 0  # not yet deep enough
    rpc(world.anvil.url, "anvil_reorg", [2, []])
    world.chain.tx.reset_nonces()
    for _ in range(3):
        rpc(world.anvil.url, "evm_mine")
    indexer.run_once()
    assert indexer.reorgs == 0
    assert [tx for _, tx in _events(market)] == [first.tx_hash]
    assert lost.tx_hash not in {tx for _, tx in _events(market)}
