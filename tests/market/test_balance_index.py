"""The book's figures follow the indexed escrow events: a real market on a real anvil with a v2
escrow, its chain indexer run by hand (no jobs, so no backstop pass runs).

After one indexer run the book shows a bid exactly when its owner's free balance pays one unit
of it, whatever other accounts do; a deposit lets a bid the match gate held back trade; the
accounts the events moved are read again only if they hold something on the market; and a
provider's unstaking counts at its next heartbeat.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from contracts.messages import address_of
from market.errors import UnfundedError
from market.escrow_reader import EscrowReader
from market.indexer import Indexer
from market.models import HeartbeatCreate, OrderCreate, PlaceResult
from market.service import MarketService
from market.settings import Settings
from tests.rpc_proxy import RpcProxy

from . import chain as fixtures
from .chain import MIN_WINDOW, ChainWorld, attach, deal_quote, match, open_on_chain
from .conftest import Clock
from .signing import Trader

# The chain fixtures: one anvil and v2 deployment per session, reverted per test.
chain_session = fixtures.chain_session
world = fixtures.world
market = fixtures.market

CLASS = "tpu-v5e"  # the traders' default device class
PRICE = 100  # the bids' price: one unit of a bid costs this much
STRANGERS = 50


def _indexer(world: ChainWorld, service: MarketService) -> Indexer:
    return Indexer(service, rpc_url=world.anvil.url, escrow=world.escrow.address)


def _place(service: MarketService, body: dict[str, Any]) -> PlaceResult:
    [placed] = service.place([OrderCreate.model_validate(body)])
    return placed


def _register(world: ChainWorld, service: MarketService, provider: Trader) -> None:
    """Stake the market's minimum for `provider` and heartbeat it: its class has a book."""
    world.escrow.stake(provider.key, service.settings.min_provider_stake)
    _beat(service, provider)


def _beat(service: MarketService, provider: Trader) -> None:
    beat = provider.heartbeat(service.now())
    service.heartbeat(HeartbeatCreate.model_validate(beat), beat["advert"])


def _set_balance(world: ChainWorld, key: str, balance: int) -> None:
    """Deposit or withdraw so that `key`'s free escrow balance is `balance`."""
    have = world.escrow.balance_of(address_of(key))
    if balance > have:
        world.escrow.deposit(key, balance - have)
    elif balance < have:
        world.escrow.withdraw(key, have - balance)


def _resting_bid(
    world: ChainWorld, service: MarketService, quantity: int = 10
) -> tuple[Trader, Trader, Indexer, PlaceResult]:
    """A registered provider and a client whose bid of `quantity` units at `PRICE` rests,
    funded in full; return them, an indexer on the real node and the placed bid."""
    provider, client = world.trader(world.providers[0]), world.trader(world.clients[0])
    indexer = _indexer(world, service)
    _register(world, service, provider)
    world.escrow.deposit(client.key, quantity * PRICE)
    placed = _place(service, client.bid(service.now(), price=PRICE, quantity=quantity))
    return provider, client, indexer, placed


def _bid_prices(service: MarketService) -> list[int]:
    return [level.price for level in service.book(CLASS).bids]


def _ask(service: MarketService, provider: Trader, *, quantity: int) -> PlaceResult:
    now = service.now()
    quote = provider.quote(slo_ms=100, valid_until=now + 3_600, challenge_window=MIN_WINDOW)
    return _place(service, provider.ask(now, price=PRICE, quantity=quantity, quote=quote))


class CountedReader(EscrowReader):
    """The market's escrow reader, counting the figures read through it."""

    def __init__(self, settings: Settings) -> None:
        super().__init__(settings)
        self.count = 0

    def balance_of(self, account: str) -> int:
        self.count += 1
        return super().balance_of(account)

    def stake_of(self, provider: str) -> int:
        self.count += 1
        return super().stake_of(provider)


@pytest.fixture
def counted(
    world: ChainWorld, market: MarketService, tmp_path: Path
) -> Iterator[tuple[MarketService, CountedReader]]:
    """A market like `market` (its own data dir) whose escrow reads are counted."""
    settings = market.settings.model_copy(update={"data_dir": tmp_path / "counted"})
    reader = CountedReader(settings)
    service = MarketService(settings, clock=Clock(world.now()), escrow=reader)
    yield service, reader
    service.close()


def test_bid_shows_one_indexer_run_after_its_owners_balance_changes_iff_it_pays_one_unit(
    world: ChainWorld, market: MarketService
) -> None:
    _, client, indexer, _ = _resting_bid(world, market)
    indexer.run_once()
    assert _bid_prices(market) == [PRICE]
    # Down to nothing, back across the one-unit line both ways, by one unit and by one token.
    for balance in (0, PRICE - 1, PRICE, 10 * PRICE, PRICE - 1, 0, 3 * PRICE):
        _set_balance(world, client.key, balance)
        indexer.run_once()
        assert client.address in indexer.moved
        assert _bid_prices(market) == ([PRICE] if balance >= PRICE else []), balance


def test_bid_the_gate_held_back_trades_one_indexer_run_after_its_owner_deposits(
    world: ChainWorld, market: MarketService
) -> None:
    provider, client, indexer, placed = _resting_bid(world, market)
    bid = placed.order
    world.escrow.withdraw(client.key, 10 * PRICE)
    indexer.run_once()
    assert _bid_prices(market) == []
    ask = _ask(market, provider, quantity=10)  # crosses the bid; the empty wallet takes none
    assert ask.fills == [] and ask.order.state == "open"
    assert market.order(bid.order_id).remaining == 10
    world.escrow.deposit(client.key, 10 * PRICE)
    indexer.run_once()
    assert market.order(bid.order_id).state == "filled"
    assert market.order(ask.order.order_id).state == "filled"
    book = market.book(CLASS)
    assert book.bids == [] and book.asks == []


def test_other_accounts_deposits_and_withdrawals_never_change_which_bids_of_a_client_show(
    world: ChainWorld, market: MarketService
) -> None:
    provider = world.trader(world.providers[0])
    client, other, stranger = (world.trader(k) for k in world.clients[:3])
    indexer = _indexer(world, market)
    _register(world, market, provider)
    world.escrow.deposit(client.key, PRICE)
    _place(market, client.bid(market.now(), price=PRICE, quantity=1))
    other_price = PRICE + 10  # a live bidder too, at its own price level (and one live order
    # needs `min_balance_per_order`, 100, of balance)
    world.escrow.deposit(other.key, other_price)
    _place(market, other.bid(market.now(), price=other_price, quantity=1))
    balances = {other.key: other_price, stranger.key: 0}
    for client_pays in (True, False):
        _set_balance(world, client.key, PRICE if client_pays else 0)
        indexer.run_once()
        steps = [(other, 0), (stranger, 500), (other, other_price), (stranger, 0), (other, 10**6)]
        for who, balance in [*steps, (stranger, 7), (other, other_price - 1)]:
            _set_balance(world, who.key, balance)
            balances[who.key] = balance
            indexer.run_once()
            assert indexer.moved == {who.address}
            prices = _bid_prices(market)
            assert (PRICE in prices) is client_pays, (who.address, balance)
            assert (other_price in prices) is (balances[other.key] >= other_price)


def test_deposits_of_accounts_with_nothing_on_the_market_cost_no_read_however_many(
    world: ChainWorld, counted: tuple[MarketService, CountedReader]
) -> None:
    """The bound: one indexer run reads at most one balance per owner of live bids and one
    stake per owner of live asks or registered provider among the accounts its events moved,
    however many events moved them; accounts with nothing on the market are never read."""
    market, reads = counted
    provider, client, indexer, _ = _resting_bid(world, market, quantity=1)
    indexer.run_once()
    strangers = ["0x" + os.urandom(32).hex() for _ in range(STRANGERS)]
    for number, key in enumerate(strangers, 1):
        world.fund(key)
        world.escrow.deposit(key, number)
    for _ in range(20):  # one stranger deposits a token at a time, again and again
        world.escrow.deposit(strangers[0], 1)
    for _ in range(5):  # the live bidder and the registered provider, several times each
        world.escrow.deposit(client.key, 1)
        world.escrow.deposit(provider.key, 1)
    before = reads.count
    indexer.run_once()
    stranger_addresses = {address_of(k) for k in strangers}
    assert indexer.moved == stranger_addresses | {client.address, provider.address}
    assert reads.count - before == 2  # the client's balance and the provider's stake, once
    assert market.funds.balances.cached(client.address) == PRICE + 5
    assert all(market.funds.balances.cached(a) is None for a in stranger_addresses)
    assert all(market.funds.stakes.cached(a) is None for a in stranger_addresses)
    # The strangers' own runs: still no read, however many accounts and deposits.
    for key in strangers[:10]:
        world.escrow.withdraw(key, 1)
    before = reads.count
    indexer.run_once()
    assert len(indexer.moved) == 10 and reads.count == before


def test_provider_unstaking_below_the_minimum_is_refused_its_next_heartbeat_after_one_run(
    world: ChainWorld, market: MarketService
) -> None:
    provider = world.trader(world.providers[0])
    indexer = _indexer(world, market)
    minimum = market.settings.min_provider_stake
    _register(world, market, provider)
    _ask(market, provider, quantity=10)
    indexer.run_once()
    assert market.funds.stakes.cached(provider.address) == minimum
    world.escrow.unstake(provider.key, 1)
    indexer.run_once()
    assert market.funds.stakes.cached(provider.address) == minimum - 1
    clock = market.clock
    assert isinstance(clock, Clock)
    clock.advance(1)  # a heartbeat must come after the last one
    with pytest.raises(UnfundedError):
        _beat(market, provider)
    # The existing rule then applies: a provider silent past its TTL has its asks out of the book.
    assert [level.price for level in market.book(CLASS).asks] == [PRICE]
    clock.advance(market.settings.provider_offline_after_s + 1)
    assert market.book(CLASS).asks == []


class SwitchableNode(RpcProxy):
    """A JSON-RPC proxy in front of the real node; while `up` is False it answers 503, as a
    node behind a load balancer that lost it."""

    def __init__(self, upstream: str) -> None:
        super().__init__(upstream)
        self.up = True

    def intercept(self, body: bytes) -> tuple[int, bytes] | None:
        return None if self.up else (503, b"")


def test_an_account_whose_figure_could_not_be_read_is_read_after_the_next_run(
    world: ChainWorld, market: MarketService, tmp_path: Path
) -> None:
    """The market's reads go through a node that fails while the indexer (on its own node)
    sees a withdrawal: the last figure stands until a later run reads it, with no new event."""
    node = SwitchableNode(world.anvil.url)
    settings = market.settings.model_copy(
        update={"data_dir": tmp_path / "flaky", "rpc_url": node.url}
    )
    service = MarketService(settings, clock=Clock(world.now()))
    try:
        _, client, indexer, _ = _resting_bid(world, service)  # the indexer: the real node
        indexer.run_once()
        assert _bid_prices(service) == [PRICE]
        world.escrow.withdraw(client.key, 10 * PRICE)
        node.up = False
        assert indexer.run_once() > 0 and client.address in indexer.moved
        assert _bid_prices(service) == [PRICE]  # not read: the last figure stands
        node.up = True
        assert indexer.run_once() == 0  # no new event; the account kept from the last run
        assert _bid_prices(service) == []
    finally:
        service.close()
        node.close()


def test_a_deal_opened_on_chain_stops_counting_against_its_client_one_indexer_run_later(
    world: ChainWorld, market: MarketService
) -> None:
    """The funds check's commitments (`market.commitments`) follow the indexed DealOpened: the
    deal's spend counts while it is only matched, and not once the escrow locked it."""
    provider, client = world.trader(world.providers[0]), world.trader(world.clients[0])
    indexer = _indexer(world, market)
    deal_id, terms = match(world, market, provider, client, price=1_000, quantity=10)
    assert market.commitments.committed(client.address, market.now()) == 10_000
    quote = deal_quote(provider, terms, client.address, 10_000, market.now() + 600)
    attach(market, deal_id, quote, provider.key)
    open_on_chain(world, market, deal_id, client.key, provider.key)
    assert market.commitments.committed(client.address, market.now()) == 10_000
    indexer.run_once()
    assert market.deal(deal_id).chain_deal_id is not None
    assert market.commitments.committed(client.address, market.now()) == 0
    # and what is left on the escrow (locked in the deal: 0 free) is read again on its next bid
    with pytest.raises(UnfundedError):
        _place(market, client.bid(market.now(), price=PRICE, quantity=1))
