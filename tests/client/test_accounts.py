"""A client's deposits, balances, spending caps and quote checks against a real escrow.

Quotes are checked before a deal is opened: a quote for another client, a challenge window
below the escrow's or the client's minimum, an arbiter who is the provider, or a fill's quote
that changes the terms of the ask the client bid on (as a lying market could serve) are all
refused with nothing locked.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from client.accounts import Balances, ClientAccount
from client.errors import DealMismatch, SpendingCapExceeded
from contracts.binding import DEAL_CLOSED
from contracts.messages import ZERO_ADDRESS, Quote
from tests.contracts.builders import quote
from tests.contracts.conftest import World


def _client(world: World, funds: int = 10_000, **options: Any) -> ClientAccount:
    key = world.anvil.new_funded_key()
    world.token.mint(world.deployer, world.addr(key), funds)
    return ClientAccount(world.escrow, world.token, key, **options)


def test_deposit_open_and_close_keep_every_token_accounted(world: World) -> None:
    account = _client(world, spending_cap=6_000)
    account.deposit(8_000)
    provider = world.providers[0]
    q = quote(world, provider, account.key, stake=0)
    deal = account.open_deal(q, q.sign(world.escrow.domain, provider), 5_000)
    assert account.balances() == Balances(wallet=2_000, free=3_000, locked=5_000)
    assert account.last_open_block == world.chain.w3.eth.block_number
    q2 = quote(world, provider, account.key, stake=0)
    with pytest.raises(SpendingCapExceeded, match=r"past the client cap 0\.006000"):
        account.open_deal(q2, q2.sign(world.escrow.domain, provider), 1_001)
    account.close(deal)
    world.escrow.close_deal(provider, deal)
    assert world.escrow.get_deal(deal).status == DEAL_CLOSED
    assert account.balances().total == 10_000
    account.withdraw(8_000)
    assert account.balances().wallet == 10_000


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"client": "stranger"}, "is for 0x"),
        ({"challenge_window": 59}, "under the 60 s this client needs"),
        ({"arbiter": "provider"}, "as arbiter: the provider or nobody"),
        ({"arbiter": ZERO_ADDRESS}, "as arbiter: the provider or nobody"),
    ],
)
def test_open_deal_refuses_an_unsafe_quote_and_locks_nothing(
    world: World, change: dict[str, Any], reason: str
) -> None:
    account = _client(world)
    account.deposit(5_000)
    provider = world.providers[0]
    values = {
        "stranger": world.addr(world.stranger),
        "provider": world.addr(provider),
    }
    q = quote(world, provider, account.key, stake=0)
    changes = {k: values.get(v, v) if isinstance(v, str) else v for k, v in change.items()}
    bad = replace(q, **changes)
    count = world.escrow.deal_count()
    with pytest.raises(DealMismatch, match=reason):
        account.open_deal(bad, bad.sign(world.escrow.domain, provider), 1_000)
    assert world.escrow.deal_count() == count
    assert world.escrow.balance_of(account.address) == 5_000


def test_open_deal_refuses_a_window_below_the_clients_own_minimum(world: World) -> None:
    account = _client(world, min_challenge_window=600)
    account.deposit(5_000)
    provider = world.providers[0]
    q = quote(world, provider, account.key, stake=0, challenge_window=300)
    assert q.challenge_window >= world.escrow.min_challenge_window()  # the escrow would take it
    least = world.escrow.min_challenge_window()
    needs = rf"600 s this client needs to dispute a claim \(escrow minimum {least} s"
    with pytest.raises(DealMismatch, match=needs):
        account.open_deal(q, q.sign(world.escrow.domain, provider), 1_000)


def _record(world: World, account: ClientAccount, ask: Quote, fill: Quote) -> dict[str, Any]:
    """A market deal record as a market serves it: the ask's terms and the fill's quote."""
    provider = world.providers[0]
    domain = world.escrow.domain
    return {
        "deal_id": "tpu:1",
        "client": account.address,
        "provider": ask.provider,
        "max_spend": "1000",
        "chain_deal_id": None,
        "bid": {"slo_ms": ask.slo_ms},
        "ask": {"quote": ask.to_json(), "quote_signature": "0x" + ask.sign(domain, provider).hex()},
        "quote": fill.to_json(),
        "quote_signature": "0x" + fill.sign(domain, provider).hex(),
        "quote_hash": "0x" + fill.struct_hash().hex(),
    }


@pytest.mark.parametrize(
    ("change", "which"),
    [
        ({"penalty": 0}, "penalty"),
        ({"stake": 0}, "stake"),  # below the fill's share of the ask's stake
        ({"challenge_window": 61}, "challenge_window"),
        ({"duration": 7_200}, "duration"),
    ],
)
def test_open_market_deal_refuses_a_fill_quote_that_changes_the_asks_terms(
    world: World, change: dict[str, int], which: str
) -> None:
    account = _client(world)
    account.deposit(5_000)
    provider = world.providers[0]
    world.escrow.stake(provider, 10**6)
    ask = replace(quote(world, provider, account.key), client=ZERO_ADDRESS)
    fill = replace(ask, client=account.address, nonce=ask.nonce + 10**9, **change)
    with pytest.raises(DealMismatch, match=f"changes the terms of the ask it fills: {which}"):
        account.open_market_deal(_record(world, account, ask, fill))
    assert world.escrow.balance_of(account.address) == 5_000


def test_open_market_deal_refuses_the_asks_own_quote_naming_nobody(world: World) -> None:
    account = _client(world)
    account.deposit(5_000)
    ask = replace(quote(world, world.providers[0], account.key), client=ZERO_ADDRESS)
    with pytest.raises(DealMismatch, match="not signed this fill's quote yet"):
        account.open_market_deal(_record(world, account, ask, ask))


def test_open_market_deal_opens_a_fill_quote_that_keeps_the_terms(world: World) -> None:
    account = _client(world)
    account.deposit(5_000)
    provider = world.providers[0]
    world.escrow.stake(provider, 10**6)
    ask = replace(quote(world, provider, account.key), client=ZERO_ADDRESS)
    fill = replace(ask, client=account.address, nonce=ask.nonce + 10**9)
    opened = account.open_market_deal(_record(world, account, ask, fill))
    deal = world.escrow.get_deal(opened.chain_deal_id)
    assert (deal.client, deal.locked, deal.penalty) == (account.address, 1_000, ask.penalty)
    assert opened.open_block == world.chain.w3.eth.block_number
