"""Fixtures: one anvil and one deployment per session, a snapshot revert around each test."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from contracts.binding import Chain, Escrow, Token
from contracts.chain import Anvil
from contracts.messages import address_of

FUNDS = 10**15  # 1e9 tokens of 6 decimals per account


@dataclass
class World:
    """A deployed escrow and token on a running anvil, with funded actors."""

    anvil: Anvil
    chain: Chain
    escrow: Escrow
    token: Token
    deployer: str
    clients: list[str]
    providers: list[str]
    arbiter: str
    stranger: str

    def addr(self, key: str) -> str:
        """Return the address of a key."""
        return address_of(key)

    def now(self) -> int:
        """Return the latest block's timestamp."""
        return int(self.chain.w3.eth.get_block("latest")["timestamp"])


@pytest.fixture(scope="session")
def anvil() -> Iterator[Anvil]:
    with Anvil.start(accounts=10) as chain:
        yield chain


@pytest.fixture(scope="session")
def deployed(anvil: Anvil) -> World:
    chain = Chain(anvil.url)
    keys = anvil.keys
    deployment = chain.deploy(keys[0])
    escrow = chain.escrow(deployment.escrow)
    token = chain.token(deployment.token)
    world = World(
        anvil=anvil,
        chain=chain,
        escrow=escrow,
        token=token,
        deployer=keys[0],
        clients=keys[1:4],
        providers=keys[4:7],
        arbiter=keys[7],
        stranger=keys[8],
    )
    for key in keys[1:9]:
        token.mint(keys[0], address_of(key), FUNDS)
        token.approve(key, escrow.address, 2**256 - 1)
    return world


@pytest.fixture
def world(deployed: World) -> Iterator[World]:
    snapshot = deployed.anvil.snapshot()
    try:
        yield deployed
    finally:
        deployed.anvil.revert(snapshot)
        deployed.chain.tx.reset_nonces()
