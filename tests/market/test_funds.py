"""Abuse priced: a real market server on a real anvil with a v2 escrow refuses orders and
adverts that have no escrow funds or stake behind them, and limits each signing account
wherever its requests come from.

Every key is fresh and funded with tokens in its wallet only: what it deposits or stakes on the
escrow is what the test is about.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from contracts.chain import Anvil

from .chain import MIN_WINDOW, ChainWorld, deploy_world
from .server import market_process, market_server, peak_rss_mb
from .signing import Trader

STAKE = 1_000_000  # the market's default minimum provider stake
CLASS = "tpu-v5e"


@pytest.fixture(scope="module")
def world() -> Iterator[ChainWorld]:
    with Anvil.start(accounts=10) as anvil:
        yield deploy_world(anvil)


@pytest.fixture(scope="module")
def market(
    world: ChainWorld, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, int]]:
    data_dir = tmp_path_factory.mktemp("funds") / "data"
    flags = ["--rpc-url", world.anvil.url, "--escrow", world.escrow.address, "--chain-id", "31337"]
    with market_process(data_dir, *flags) as served:
        yield served


@pytest.fixture
def url(market: tuple[str, int]) -> str:
    return market[0]


def _fresh(world: ChainWorld) -> Trader:
    """A new key with ether and tokens in its wallet, nothing on the escrow."""
    key = "0x" + os.urandom(32).hex()
    world.fund(key)
    return world.trader(key)


def _post(url: str, path: str, body: dict[str, Any], status: int) -> dict[str, Any]:
    response = httpx.post(url + path, json=body, timeout=30)
    assert response.status_code == status, response.text
    reply: dict[str, Any] = response.json()
    return reply


def _ask(provider: Trader, *, price: int = 1_000, quantity: int = 100, **kw: Any) -> dict[str, Any]:
    now = int(time.time())
    quote = provider.quote(
        slo_ms=100,
        valid_until=now + 3_600,
        challenge_window=MIN_WINDOW,
        **{k: v for k, v in kw.items() if k in ("stake", "penalty")},
    )
    fields = {k: v for k, v in kw.items() if k not in ("stake", "penalty")}
    return provider.ask(now, price=price, quantity=quantity, quote=quote, **fields)


def _seller(world: ChainWorld, url: str, device_class: str = CLASS) -> Trader:
    """A staked provider, live (it heartbeats), with an ask at 1,000 per unit in
    `device_class`."""
    provider = _fresh(world)
    world.escrow.stake(provider.key, 2 * STAKE)
    beat = provider.heartbeat(int(time.time()), device_class=device_class)
    _post(url, "/v1/providers/heartbeat", beat, 200)
    _post(url, "/v1/orders", _ask(provider, device_class=device_class), 201)
    return provider


def test_bid_when_its_signer_has_no_free_escrow_balance_then_403_until_it_deposits(
    world: ChainWorld, url: str
) -> None:
    _seller(world, url)
    client = _fresh(world)
    now = int(time.time())
    refused = _post(url, "/v1/orders", client.bid(now, price=100, quantity=10), 403)
    assert refused["error"] == "UnfundedError"
    assert "need 1000" in refused["detail"] and "free escrow balance is 0" in refused["detail"]
    world.escrow.deposit(client.key, 1_500)  # bid again at once: refusals read the escrow afresh
    first = _post(url, "/v1/orders", client.bid(now, price=100, quantity=10), 201)
    assert first["order"]["state"] == "open"
    # The live bid's 1,000 stays committed: another 1,000 is not covered by 1,500.
    refused = _post(url, "/v1/orders", client.bid(now, price=100, quantity=10), 403)
    assert "on top of 1000 committed" in refused["detail"]
    cancel = client.cancel(first["order"]["order_id"], now)
    _post(url, "/v1/orders/cancel", cancel, 200)
    _post(url, "/v1/orders", client.bid(now, price=100, quantity=10), 201)


def test_bid_when_it_matched_into_a_deal_not_yet_opened_then_that_spend_stays_committed(
    world: ChainWorld, url: str
) -> None:
    seller = _seller(world, url, "tpu-v6e")
    client = _fresh(world)
    world.escrow.deposit(client.key, 10_000)
    now = int(time.time())
    body = client.bid(now, price=1_000, quantity=10, device_class="tpu-v6e")
    placed = _post(url, "/v1/orders", body, 201)
    [fill] = placed["fills"]
    deal = httpx.get(f"{url}/v1/deals/{fill['id']}", timeout=10).json()
    assert (deal["client"], deal["provider"]) == (client.address, seller.address)
    again = client.bid(now, price=1_000, quantity=1, device_class="tpu-v6e")
    refused = _post(url, "/v1/orders", again, 403)
    assert "on top of 10000 committed" in refused["detail"]


def test_ask_when_its_signer_lacks_the_stake_it_promises_then_403(
    world: ChainWorld, url: str
) -> None:
    provider = _fresh(world)
    refused = _post(url, "/v1/orders", _ask(provider), 403)
    assert refused["error"] == "UnfundedError" and "0 free stake" in refused["detail"]
    world.escrow.stake(provider.key, STAKE)
    # Staked the market's minimum, but this quote promises more than it has free.
    refused = _post(url, "/v1/orders", _ask(provider, stake=5 * STAKE), 403)
    assert f"need {5 * STAKE}" in refused["detail"]
    _post(url, "/v1/orders", _ask(provider), 201)


def test_bid_when_no_staked_provider_advertises_its_class_then_403_and_no_class_appears(
    world: ChainWorld, url: str
) -> None:
    client = _fresh(world)
    world.escrow.deposit(client.key, 10**6)
    now = int(time.time())
    for number in range(20):
        body = client.bid(now, price=1, quantity=1, device_class=f"invented-{number}")
        refused = _post(url, "/v1/orders", body, 403)
        assert "advertised by no staked provider" in refused["detail"]
    classes = httpx.get(url + "/v1/classes", timeout=10).json()
    assert not any(name.startswith("invented-") for name in classes)


def test_heartbeat_when_the_provider_has_no_stake_then_403_and_it_is_not_listed(
    world: ChainWorld, url: str
) -> None:
    intruders = [_fresh(world) for _ in range(10)]
    started = time.perf_counter()
    for number, intruder in enumerate(intruders):
        body = intruder.heartbeat(int(time.time()), device_class=f"fake-{number}")
        refused = _post(url, "/v1/providers/heartbeat", body, 403)
        assert "the market registers providers from 1000000" in refused["detail"]
    print(f"10 unstaked heartbeats refused in {time.perf_counter() - started:.2f} s")
    listed = {p["address"] for p in httpx.get(url + "/v1/providers", timeout=10).json()}
    assert not listed & {i.address for i in intruders}

    provider = _fresh(world)
    world.escrow.stake(provider.key, STAKE)
    _post(
        url,
        "/v1/providers/heartbeat",
        provider.heartbeat(int(time.time()), device_class="tpu-v7"),
        200,
    )
    listed = {p["address"] for p in httpx.get(url + "/v1/providers", timeout=10).json()}
    assert provider.address in listed
    # Its advert makes the class exist: a funded client may bid there before any ask.
    client = _fresh(world)
    world.escrow.deposit(client.key, 100)
    _post(
        url,
        "/v1/orders",
        client.bid(int(time.time()), price=1, quantity=100, device_class="tpu-v7"),
        201,
    )


def test_ask_when_a_provider_spreads_over_too_many_classes_then_403(
    world: ChainWorld, url: str
) -> None:
    provider = _fresh(world)
    world.escrow.stake(provider.key, STAKE)
    for number in range(16):  # its run-time class and a compile class per TPU generation fit
        _post(url, "/v1/orders", _ask(provider, device_class=f"spread-{number}"), 201)
    refused = _post(url, "/v1/orders", _ask(provider, device_class="spread-16"), 403)
    assert refused["error"] == "QuotaError" and "at most 16" in refused["detail"]


def test_flood_when_an_unfunded_key_or_a_funded_one_posts_thousands_of_orders_then_bounded(
    world: ChainWorld, market: tuple[str, int]
) -> None:
    url, pid = market
    _seller(world, url)  # the class exists (a staked provider asks in it), whatever ran before
    now = int(time.time())
    unfunded = _fresh(world)
    batch = {"orders": [unfunded.bid(now, price=1, quantity=1) for _ in range(500)]}
    started = time.perf_counter()
    refused = _post(url, "/v1/orders/batch", batch, 403)
    print(f"500 unfunded bids refused in {1000 * (time.perf_counter() - started):.0f} ms")
    assert "free escrow balance is 0" in refused["detail"]

    rich = _fresh(world)
    world.escrow.deposit(rich.key, 10**9)
    for _ in range(2):
        batch = {"orders": [rich.bid(now, price=1, quantity=1) for _ in range(500)]}
        _post(url, "/v1/orders/batch", batch, 201)
    refused = _post(url, "/v1/orders", rich.bid(now, price=1, quantity=1), 403)
    assert refused["error"] == "QuotaError" and "at most 1000" in refused["detail"]
    mine = httpx.get(url + "/v1/orders", params={"owner": unfunded.address}, timeout=10).json()
    assert mine == []
    print(f"market peak RSS after the floods: {peak_rss_mb(pid):.0f} MiB")


def test_bids_when_a_barely_funded_key_posts_many_then_its_live_orders_are_bounded_by_balance(
    world: ChainWorld, url: str
) -> None:
    """A key's live orders are bounded by its free balance: one per `min_balance_per_order`
    (100 base units by default), so 1,000 units hold 10 one-unit bids of price 1, not 1,000."""
    _seller(world, url, "tpu-v7b")
    barely = _fresh(world)
    world.escrow.deposit(barely.key, 1_000)
    now = int(time.time())
    bids = [barely.bid(now, price=1, quantity=1, device_class="tpu-v7b") for _ in range(11)]
    for body in bids[:10]:
        _post(url, "/v1/orders", body, 201)
    refused = _post(url, "/v1/orders", bids[10], 403)
    assert refused["error"] == "QuotaError"
    assert "would hold 11 live orders" in refused["detail"]
    assert "covers 10 at 100 each" in refused["detail"]
    batch = {"orders": [barely.bid(now, price=1, quantity=1, device_class="tpu-v7b")]}
    _post(url, "/v1/orders/batch", batch, 403)
    book = httpx.get(url + "/v1/book/tpu-v7b", timeout=10).json()
    assert sum(level["orders"] for level in book["bids"]) == 10


def test_rate_limit_when_a_signer_spreads_over_source_addresses_then_its_own_bucket_holds(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """Per-IP buckets do not add up for one signer: six loopback addresses, one bucket (one
    order now, one more every 2 s)."""
    data_dir = tmp_path_factory.mktemp("per-signer") / "data"
    with market_server(data_dir, "--rate-per-address", "0.5") as url:
        signer, other = Trader(), Trader()
        now = int(time.time())
        statuses = []
        for host in range(2, 8):
            transport = httpx.HTTPTransport(local_address=f"127.0.0.{host}")
            with httpx.Client(transport=transport, base_url=url, timeout=10) as client:
                statuses.append(client.post("/v1/orders", json=signer.bid(now)).status_code)
        assert statuses == [201, 429, 429, 429, 429, 429]
        _post(url, "/v1/orders", other.bid(now), 201)  # another signer has its own bucket
