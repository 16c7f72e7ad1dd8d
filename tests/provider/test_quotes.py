"""Per-fill quotes: the daemon signs one quote per market deal, through a real market process.

The market runs as ``python -m market.cli market serve`` on the shared anvil; the provider's
operator posts an ask carrying its terms (a quote naming no client), clients bid, and the
daemon's quote job (``daemon.quotes.run()``, as its scheduler calls it) attaches a quote
naming each deal's client, which that client opens on chain.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from client.market_http import MarketHttp
from contracts.chain import free_port
from contracts.messages import ZERO_ADDRESS, Quote, address_of
from contracts.orders import Ask, Bid, market_domain, order_id, plan_kind
from contracts.pricing import locked_stake
from provider.config import SettlementConfig
from provider.daemon import Daemon
from provider.quotes import MAX_QUOTES_PER_FILL
from provider.sandbox import Sandbox
from tests import processes
from tests.provider.daemon_support import (
    CHALLENGE_WINDOW,
    FUNDS,
    PENALTY,
    PLAN,
    SLO_S,
    ChainWorld,
    provider_config,
    wait_until,
)

REPO = Path(__file__).resolve().parents[2]
STAKE = 10**6
PRICE = 1_000
_nonces = itertools.count(10_000)


@pytest.fixture(scope="module")
def market_url(chain_world: ChainWorld, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The market server as its own process, indexing the shared escrow."""
    work = tmp_path_factory.mktemp("market")
    port = free_port()
    args = [sys.executable, "-m", "market.cli", "market", "serve", "--port", str(port)]
    args += ["--data-dir", str(work), "--rpc-url", chain_world.anvil.url]
    args += ["--escrow", chain_world.escrow.address, "--chain-id", str(chain_world.domain.chain_id)]
    log = (work / "market.log").open("ab")
    process = processes.spawn(
        args, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "DATABASE_URL": ""}
    )
    url = f"http://127.0.0.1:{port}"

    def up() -> bool:
        if process.poll() is not None:
            raise AssertionError(f"market exited: {(work / 'market.log').read_text()[-3000:]}")
        with contextlib.suppress(httpx.HTTPError):
            return httpx.get(url + "/healthz", timeout=2).status_code == 200
        return False

    try:
        wait_until(up, 120, "the market")
        yield url
    finally:
        processes.stop(process, grace_s=30)
        log.close()


@pytest.fixture
def provider_key(chain_world: ChainWorld) -> str:
    """A fresh provider with tokens and exactly one quote's stake."""
    world = chain_world
    key = world.anvil.new_funded_key()
    world.token.mint(world.deployer, address_of(key), FUNDS)
    world.token.approve(key, world.escrow.address, 2**256 - 1)
    world.escrow.stake(key, STAKE)
    return key


@pytest.fixture
def quoting(
    chain_world: ChainWorld,
    sandbox: Sandbox,
    market_url: str,
    provider_key: str,
    tmp_path: Path,
) -> Iterator[Daemon]:
    """A started daemon of ``provider_key`` that knows the market (its jobs run by hand)."""
    config = provider_config(chain_world, tmp_path, private_key=provider_key, market_url=market_url)
    node = Daemon(config, chain=chain_world.chain, sandbox=sandbox)
    try:
        node.start(schedule=False)  # its first heartbeat: only live providers' asks match
        yield node
    finally:
        node.close()


def post_ask(world: ChainWorld, market_url: str, key: str, quantity: int, **terms: Any) -> None:
    """As the provider's operator: post an ask carrying its terms (a quote naming nobody)."""
    expiry = world.chain_time() + 1_800
    nonce = next(_nonces)
    quote = Quote(
        provider=address_of(key),
        client=ZERO_ADDRESS,
        arbiter=address_of(world.arbiter),
        max_spend=PRICE * quantity,
        stake=STAKE,
        penalty=PENALTY,
        duration=3_600,
        challenge_window=terms.get("window", CHALLENGE_WINDOW),
        slo_ms=SLO_S * 1000,
        valid_until=expiry,
        nonce=nonce,
        plan=PLAN,
    )
    ask = Ask(
        owner=address_of(key),
        device_class="cpu",
        quantity=quantity,
        price=PRICE,
        plan=plan_kind(PLAN),
        slo_ms=SLO_S * 1000,
        memory=0,
        expiry=expiry,
        nonce=nonce,
        quote_hash=quote.struct_hash(),
    )
    domain = market_domain(world.domain.chain_id, world.escrow.address)
    market = MarketHttp(market_url)
    try:
        market.place_order(
            ask,
            ask.sign(domain, key),
            quote=quote,
            quote_signature=quote.sign(world.domain, key),
        )
    finally:
        market.close()


def one_unit_bid(world: ChainWorld, client: str, price: int = PRICE) -> Bid:
    """Return a client's bid for one unit at `price` (its funds deposited first: the market
    admits bids the escrow balance covers, counting this client's deals of earlier tests that
    were matched but never opened, so enough for a few)."""
    world.escrow.deposit(client, 4 * PRICE)
    return Bid(
        owner=address_of(client),
        device_class="cpu",
        quantity=1,
        price=price,
        plan=plan_kind(PLAN),
        slo_ms=SLO_S * 1000,
        memory=0,
        expiry=world.chain_time() + 1_800,
        nonce=next(_nonces),
    )


def bid(world: ChainWorld, market_url: str, client: str) -> dict[str, Any]:
    """As a client with the funds in escrow: bid for one unit; return the deal record."""
    domain = market_domain(world.domain.chain_id, world.escrow.address)
    order = one_unit_bid(world, client)
    market = MarketHttp(market_url)
    try:
        market.place_bid(order, domain, client)
        bid_id = order_id(order, domain)
        records = market.wait_for_deals(address_of(client), bid_id)
    finally:
        market.close()
    assert len(records) == 1
    return records[0]


def market_deal(market_url: str, deal_id: str) -> dict[str, Any]:
    market = MarketHttp(market_url)
    try:
        return market.deal(deal_id)
    finally:
        market.close()


def test_matched_deal_then_daemon_attaches_a_quote_naming_its_client_who_opens_it(
    chain_world: ChainWorld, market_url: str, quoting: Daemon, provider_key: str
) -> None:
    world = chain_world
    post_ask(world, market_url, provider_key, quantity=1)
    record = bid(world, market_url, world.client)
    assert record["quote"] is None  # the ask's quote states terms; it opens nothing
    assert quoting.quotes is not None

    sent = quoting.quotes.run()

    assert [q.market_deal_id for q in sent] == [record["deal_id"]]
    attached = market_deal(market_url, record["deal_id"])
    quote = Quote.from_json(attached["quote"])
    assert quote.client == address_of(world.client)
    assert quote.max_spend >= int(record["max_spend"])
    assert quote.challenge_window == CHALLENGE_WINDOW and quote.stake == STAKE
    assert quote.valid_until > world.chain_time()
    assert quoting.quotes.run() == []  # one quote per deal
    signature = bytes.fromhex(attached["quote_signature"][2:])
    opened = world.escrow.open_deal(world.client, quote, signature, int(record["max_spend"]))
    deal = world.escrow.get_deal(int(opened.event("DealOpened").args["dealId"]))
    assert deal.client == address_of(world.client)
    assert deal.provider == address_of(provider_key) and deal.stake == STAKE


def test_second_fill_when_free_stake_cannot_cover_both_quotes_then_refused_until_staked(
    chain_world: ChainWorld, market_url: str, quoting: Daemon, provider_key: str
) -> None:
    world = chain_world
    # Two asks of one unit: each fill holds its ask's whole stake, and only one is staked.
    post_ask(world, market_url, provider_key, quantity=1)
    post_ask(world, market_url, provider_key, quantity=1)
    first = bid(world, market_url, world.client)
    second = bid(world, market_url, world.other_client)
    assert quoting.quotes is not None

    sent = quoting.quotes.run()

    assert len(sent) == 1  # the stake covers one outstanding quote
    quoted = {first["deal_id"], second["deal_id"]} - {sent[0].market_deal_id}
    assert market_deal(market_url, quoted.pop())["quote"] is None
    assert b'tpumarket_provider_quotes_total{result="refused"} 1.0' in quoting.metrics.render()
    world.escrow.stake(provider_key, STAKE)
    again = quoting.quotes.run()
    assert len(again) == 1 and again[0].market_deal_id != sent[0].market_deal_id


def test_a_fill_of_one_unit_holds_its_share_of_the_ask_s_stake_not_all_of_it(
    chain_world: ChainWorld, market_url: str, quoting: Daemon, provider_key: str
) -> None:
    """Locking a provider's stake costs the locker in proportion: one unit of two holds half
    of the ask's stake, so the two one-unit fills fit the stake of the ask. (The ask is filled
    whole: the market is shared by this module's tests, and a later bid must not match it.)"""
    world = chain_world
    post_ask(world, market_url, provider_key, quantity=2)
    records = [bid(world, market_url, client) for client in (world.client, world.other_client)]
    assert quoting.quotes is not None
    sent = quoting.quotes.run()
    assert sorted(q.market_deal_id for q in sent) == sorted(r["deal_id"] for r in records)
    assert {q.quote.stake for q in sent} == {locked_stake(STAKE, 2 * PRICE, PRICE)} == {STAKE // 2}


def test_an_expired_unopened_quote_is_signed_anew_then_the_fill_counts_as_abandoned(
    chain_world: ChainWorld,
    market_url: str,
    sandbox: Sandbox,
    provider_key: str,
    tmp_path: Path,
) -> None:
    """A client whose quote expired can still open its match (a new quote), but a client that
    lets every quote expire holds the stake only MAX_QUOTES_PER_FILL validity periods.

    A quote is past once a block later than its validUntil exists (both the daemon and the
    market judge it so: no block can open it then); the quotes here are short-lived (2 s) and
    each poll mines a block, as a live chain would.
    """
    world = chain_world
    brief = SettlementConfig(quote_valid_s=2)
    node = Daemon(
        provider_config(
            world, tmp_path, private_key=provider_key, market_url=market_url, settlement=brief
        ),
        chain=world.chain,
        sandbox=sandbox,
    )
    try:
        node.start(schedule=False)
        post_ask(world, market_url, provider_key, quantity=1)
        record = bid(world, market_url, world.client)
        job = node.quotes
        assert job is not None
        nonces: list[int] = []

        def next_quote() -> bool:
            world.chain_time()  # a live chain: blocks keep coming, their time passes
            sent = job.run()
            nonces.extend(q.quote.nonce for q in sent)
            return bool(sent)

        for _ in range(MAX_QUOTES_PER_FILL):
            wait_until(next_quote, 120, "a quote for the fill")
            attached = Quote.from_json(market_deal(market_url, record["deal_id"])["quote"])
            assert attached.nonce == nonces[-1]
        assert len(set(nonces)) == MAX_QUOTES_PER_FILL

        def refused() -> bool:
            world.chain_time()
            assert job.run() == []  # abandoned: never a fourth quote
            return b'tpumarket_provider_quotes_total{result="refused"}' in node.metrics.render()

        wait_until(refused, 120, "the fill counted as abandoned")
    finally:
        node.close()


def test_ask_whose_window_is_below_what_the_daemon_needs_then_no_quote(
    chain_world: ChainWorld,
    market_url: str,
    sandbox: Sandbox,
    provider_key: str,
    tmp_path: Path,
) -> None:
    world = chain_world
    slow = SettlementConfig(interval_s=50)  # needs windows of 120 s
    node = Daemon(
        provider_config(
            world, tmp_path, private_key=provider_key, market_url=market_url, settlement=slow
        ),
        chain=world.chain,
        sandbox=sandbox,
    )
    try:
        node.start(schedule=False)  # its first heartbeat: only live providers' asks match
        post_ask(world, market_url, provider_key, quantity=1, window=CHALLENGE_WINDOW)
        record = bid(world, market_url, world.client)
        assert node.quotes is not None

        assert node.quotes.run() == []

        assert market_deal(market_url, record["deal_id"])["quote"] is None
        assert node.journal.quotes() == []
    finally:
        node.close()


def test_an_ask_that_fills_a_resting_bid_above_its_price_is_quoted_at_the_fill_s_spend(
    chain_world: ChainWorld, market_url: str, quoting: Daemon, provider_key: str
) -> None:
    """A fill is at the resting order's price: an ask arriving under a resting bid sells its
    units at the bid's higher price, so the deal spends more than the ask's terms name. The
    daemon quotes that spend (its units are the ask's, its stake share at most the ask's)."""
    world = chain_world
    domain = market_domain(world.domain.chain_id, world.escrow.address)
    order = one_unit_bid(world, world.client, price=2 * PRICE)
    market = MarketHttp(market_url)
    try:
        market.place_bid(order, domain, world.client)
        post_ask(world, market_url, provider_key, quantity=1)
        records = market.wait_for_deals(address_of(world.client), order_id(order, domain))
    finally:
        market.close()
    assert [(r["price"], int(r["max_spend"])) for r in records] == [(2 * PRICE, 2 * PRICE)]
    assert quoting.quotes is not None
    sent = quoting.quotes.run()
    assert [q.market_deal_id for q in sent] == [records[0]["deal_id"]]
    quote = sent[0].quote
    assert (quote.max_spend, quote.stake) == (2 * PRICE, STAKE)
    signature = quote.sign(world.domain, provider_key)
    opened = world.escrow.open_deal(world.client, quote, signature, 2 * PRICE)
    assert opened.event("DealOpened").args["dealId"] > 0
