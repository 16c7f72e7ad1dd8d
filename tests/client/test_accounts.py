"""A client's deposits, balances and spending caps against a real escrow on anvil."""

from __future__ import annotations

import pytest

from client.accounts import Balances, ClientAccount
from client.errors import SpendingCapExceeded
from contracts.binding import DEAL_CLOSED
from tests.contracts.builders import quote
from tests.contracts.conftest import World


def test_deposit_open_and_close_keep_every_token_accounted(world: World) -> None:
    key = world.anvil.new_funded_key()
    world.token.mint(world.deployer, world.addr(key), 10_000)
    account = ClientAccount(world.escrow, world.token, key, spending_cap=6_000)
    account.deposit(8_000)
    q = quote(world, world.providers[0], stake=0)
    deal = account.open_deal(q, q.sign(world.escrow.domain, world.providers[0]), 5_000)
    assert account.balances() == Balances(wallet=2_000, free=3_000, locked=5_000)
    q2 = quote(world, world.providers[0], stake=0)
    with pytest.raises(SpendingCapExceeded, match="past the client cap 6000"):
        account.open_deal(q2, q2.sign(world.escrow.domain, world.providers[0]), 1_001)
    account.close(deal)
    world.escrow.close_deal(world.providers[0], deal)
    assert world.escrow.get_deal(deal).status == DEAL_CLOSED
    assert account.balances().total == 10_000
    account.withdraw(8_000)
    assert account.balances().wallet == 10_000
