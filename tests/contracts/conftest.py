"""Fixtures: one anvil and one deployment per session, a snapshot revert around each test."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from contracts.binding import Chain, Escrow, Token
from contracts.chain import Anvil
from contracts.messages import address_of
from tests import chain_clock

FUNDS = 10**15  # 1e9 tokens of 6 decimals per account
# The deployment's shortest challenge window: small, so tests with short windows can open deals;
# a quote below it is refused (`EscrowChallengeWindowTooShort`).
MIN_WINDOW = 5
ARBITRATION_PERIOD = 7 * 24 * 3600


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
        return self.anvil.latest_timestamp()

    def next_at(self, timestamp: int) -> None:
        """Make the next transaction execute at `timestamp` (mines one block just before it).

        Only with a one-second block interval (`anvil.set_block_interval(1)`): then a transaction
        sent after this runs at exactly `timestamp`, so tests hit time boundaries to the second.
        """
        gap = timestamp - 1 - self.now()
        if gap < 0:
            raise ValueError(f"timestamp {timestamp} is in the past")
        if gap:
            self.anvil.increase_time(gap)


def deploy_world(anvil: Anvil, *, arbitration_period: int = ARBITRATION_PERIOD) -> World:
    """Deploy a token and an escrow on `anvil`, fund and approve the actors; return the world."""
    chain = Chain(anvil.url)
    keys = anvil.keys
    deployment = chain.deploy(
        keys[0], min_challenge_window=MIN_WINDOW, arbitration_period=arbitration_period
    )
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


@pytest.fixture(scope="session")
def anvil() -> Iterator[Anvil]:
    with Anvil.start(accounts=10) as chain:
        yield chain


@pytest.fixture(scope="session")
def deployed(anvil: Anvil) -> World:
    return deploy_world(anvil)


@pytest.fixture
def world(deployed: World) -> Iterator[World]:
    """The session's deployment at the present (the latest block stamped now: validities taken
    from it are not already past, however long the worker ran other tests since the last
    chain test), reverted after the test, its clock back at the present."""
    chain_clock.resync(deployed.anvil)
    snapshot = deployed.anvil.snapshot()
    try:
        yield deployed
    finally:
        chain_clock.revert(deployed.anvil, snapshot)  # not left behind by the revert
        deployed.chain.tx.reset_nonces()


@pytest.fixture
def exact_clock(world: World) -> Iterator[World]:
    """The world with one second per block, so `world.next_at(t)` sets when the next tx runs."""
    world.anvil.set_block_interval(1)
    try:
        yield world
    finally:
        world.anvil.set_block_interval(None)
