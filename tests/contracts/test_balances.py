"""Deposits, withdrawals, stake and the settlement token."""

from __future__ import annotations

import pytest

from contracts import reverts
from contracts.messages import address_of

from .builders import open_deal
from .conftest import FUNDS, World


def test_deposit_when_approved_then_credits_free_balance_and_moves_tokens(world: World) -> None:
    client = world.clients[0]
    result = world.escrow.deposit(client, 1_234)
    assert world.escrow.balance_of(address_of(client)) == 1_234
    assert world.token.balance_of(world.escrow.address) == 1_234
    assert world.token.balance_of(address_of(client)) == FUNDS - 1_234
    assert result.event("Deposited").args == {"account": address_of(client), "amount": 1_234}


def test_deposit_when_zero_then_rejects(world: World) -> None:
    with pytest.raises(reverts.EscrowZeroAmount):
        world.escrow.deposit(world.clients[0], 0)


def test_deposit_when_not_approved_then_rejects_with_token_error(world: World) -> None:
    key = world.anvil.new_funded_key()
    world.token.mint(world.deployer, address_of(key), 100)
    with pytest.raises(reverts.ERC20InsufficientAllowance):
        world.escrow.deposit(key, 100)
    assert world.escrow.balance_of(address_of(key)) == 0


def test_withdraw_when_within_balance_then_returns_tokens(world: World) -> None:
    client = world.clients[0]
    world.escrow.deposit(client, 1_000)
    result = world.escrow.withdraw(client, 400)
    assert world.escrow.balance_of(address_of(client)) == 600
    assert world.token.balance_of(address_of(client)) == FUNDS - 600
    assert result.event("Withdrawn").args["amount"] == 400


def test_withdraw_when_above_balance_then_rejects_and_keeps_balance(world: World) -> None:
    client = world.clients[0]
    world.escrow.deposit(client, 1_000)
    with pytest.raises(reverts.EscrowInsufficientBalance) as info:
        world.escrow.withdraw(client, 1_001)
    assert info.value.error_args["available"] == 1_000
    assert world.escrow.balance_of(address_of(client)) == 1_000


def test_withdraw_when_zero_then_rejects(world: World) -> None:
    with pytest.raises(reverts.EscrowZeroAmount):
        world.escrow.withdraw(world.clients[0], 0)


def test_stake_and_unstake_when_free_then_move_tokens(world: World) -> None:
    provider = world.providers[0]
    assert world.escrow.stake(provider, 5_000).event("Staked").args["amount"] == 5_000
    assert world.escrow.stake_of(address_of(provider)) == 5_000
    assert world.escrow.unstake(provider, 2_000).event("Unstaked").args["amount"] == 2_000
    assert world.escrow.stake_of(address_of(provider)) == 3_000
    assert world.token.balance_of(address_of(provider)) == FUNDS - 3_000


def test_stake_when_zero_then_rejects(world: World) -> None:
    with pytest.raises(reverts.EscrowZeroAmount):
        world.escrow.stake(world.providers[0], 0)


def test_unstake_when_zero_then_rejects(world: World) -> None:
    with pytest.raises(reverts.EscrowZeroAmount):
        world.escrow.unstake(world.providers[0], 0)


def test_unstake_when_stake_is_locked_by_open_deal_then_rejects(world: World) -> None:
    provider = world.providers[0]
    world.escrow.stake(provider, 500)
    open_deal(world, world.clients[0], provider, stake=10**6)
    assert world.escrow.stake_of(address_of(provider)) == 500
    with pytest.raises(reverts.EscrowInsufficientStake) as info:
        world.escrow.unstake(provider, 501)
    assert info.value.error_args == {
        "provider": address_of(provider),
        "available": 500,
        "needed": 501,
    }


def test_token_mint_when_not_deployer_then_rejects(world: World) -> None:
    with pytest.raises(reverts.SettlementTokenUnauthorized):
        world.token.mint(world.stranger, address_of(world.stranger), 1)


def test_token_has_six_decimals(world: World) -> None:
    assert world.token.decimals() == 6
