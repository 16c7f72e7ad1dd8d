"""Where indexers start: the escrow's deployment block, told by the market, used by the client.

The market's `GET /v1/domain` names it as `escrow_block` (configured, or asked of the node as
its indexer does); the client's claim watcher reads no log below it.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from fastapi.testclient import TestClient

from client.ledger import DealLedger
from client.watch import ClaimWatcher, escrow_block_of
from contracts.errors import ChainError
from market.api.app import create_app
from market.service import MarketService, Settings

from .builders import open_deal
from .conftest import World


def served_domain(world: World, tmp_path: Path, **settings: Any) -> dict[str, Any]:
    """Return a market's `GET /v1/domain` answer for the world's escrow."""
    values: dict[str, Any] = {
        "data_dir": tmp_path / "market",
        "chain_id": world.anvil.chain_id,
        "escrow": world.escrow.address,
        "rpc_url": world.anvil.url,
        "run_jobs": False,
    }
    values.update(settings)
    service = MarketService(Settings(**values))
    try:
        with TestClient(create_app(service=service)) as api:
            answer: dict[str, Any] = api.get("/v1/domain").json()
    finally:
        service.close()
    return answer


@pytest.fixture
def deployed_at(world: World, tmp_path: Path) -> Iterator[int]:
    """The escrow's deployment block, as the market tells it."""
    block = escrow_block_of(served_domain(world, tmp_path))
    assert block is not None
    yield block


def test_market_tells_the_block_in_which_the_escrow_was_deployed(
    world: World, deployed_at: int
) -> None:
    w3 = world.chain.w3
    block = w3.eth.get_block(deployed_at, full_transactions=True)
    created = [
        w3.eth.get_transaction_receipt(tx["hash"]).get("contractAddress")
        for tx in block["transactions"]
    ]  # type: ignore[index]
    assert world.escrow.address in created


def test_market_tells_a_configured_block_and_null_when_it_knows_no_chain(
    world: World, tmp_path: Path
) -> None:
    configured = served_domain(world, tmp_path, index_from_block=7)
    assert configured["escrow_block"] == 7
    unknown = served_domain(world, tmp_path, rpc_url=None)
    assert unknown["escrow_block"] is None and escrow_block_of(unknown) is None


def test_claim_watcher_reads_the_deals_logs_from_the_block_it_is_told(
    world: World, deployed_at: int, tmp_path: Path
) -> None:
    deal_id, _ = open_deal(world, world.clients[0], world.providers[0])
    opened = int(world.chain.w3.eth.block_number)

    def watcher(told: int) -> ClaimWatcher:
        ledger = DealLedger(
            path=tmp_path / f"ledger-{told}.json",
            chain_id=world.anvil.chain_id,
            escrow=world.escrow.address,
            deal_id=deal_id,
        )
        account: Any = SimpleNamespace(escrow=world.escrow)
        return ClaimWatcher(account, ledger, escrow_block=lambda: told)

    found = watcher(deployed_at)
    assert found.lowest() == deployed_at
    assert found.open_block() == opened
    too_late = watcher(opened + 1)  # a block it is told is one it never reads below
    with pytest.raises(ChainError):
        too_late.open_block()
