"""A snapshot revert leaves the chain's clock at the present, never behind the host's clock.

Every test on the session's anvil runs between a snapshot and a revert (`world`); the revert
alone puts the clock back to the snapshot's instant, so a later test that takes a validity from
the chain (`latest + 600`) and hands it to a process reading the host's clock would find it past.
"""

from __future__ import annotations

import time

from contracts.chain import rpc
from tests import chain_clock

from .conftest import World


def test_revert_when_the_snapshot_is_an_hour_old_then_the_clock_is_back_at_the_present(
    world: World,
) -> None:
    anvil = world.anvil
    rpc(anvil.url, "evm_setTime", [int(time.time()) - 3_600])  # a snapshot an hour old
    rpc(anvil.url, "evm_mine")
    assert anvil.latest_timestamp() < time.time() - 3_000
    snapshot = anvil.snapshot()
    anvil.increase_time(86_400)  # the test moves the chain a day ahead
    before = time.time()
    chain_clock.revert(anvil, snapshot)
    assert anvil.latest_timestamp() >= int(before)
    rpc(anvil.url, "evm_mine")  # and later blocks follow the present, not the snapshot
    assert anvil.latest_timestamp() >= int(before)


def test_resync_when_the_chain_is_ahead_then_its_clock_never_goes_back(world: World) -> None:
    world.anvil.increase_time(7 * 86_400)  # `world`'s revert brings it back after the test
    ahead = world.anvil.latest_timestamp()
    assert chain_clock.resync(world.anvil) > ahead
