"""A real market server on a real anvil with a v2 escrow: windows read from the escrow, quotes
per fill over HTTP, the server's own indexer job linking the deals and scoring the provider."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from contracts.chain import Anvil
from contracts.messages import Quote, Voucher, task_bitmap
from tests.market.chain import MIN_WINDOW, ChainWorld, deploy_world
from tests.market.server import market_server
from tests.polling import hang_ceiling_s


@pytest.fixture(scope="module")
def world() -> Iterator[ChainWorld]:
    with Anvil.start(accounts=10) as anvil:
        yield deploy_world(anvil)


@pytest.fixture(scope="module")
def market(world: ChainWorld, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    data_dir = tmp_path_factory.mktemp("market") / "data"
    flags = ["--rpc-url", world.anvil.url, "--escrow", world.escrow.address, "--chain-id", "31337"]
    with market_server(data_dir, *flags) as url:
        yield url


def _post(url: str, body: dict[str, Any], status: int) -> dict[str, Any]:
    response = httpx.post(url, json=body, timeout=10)
    assert response.status_code == status, response.text
    reply: dict[str, Any] = response.json()
    return reply


def _until(what: Callable[[], Any], timeout_s: float = 20.0) -> Any:
    """Poll the server until `what()` is truthy (its indexer job runs every 2 s)."""
    deadline = time.monotonic() + hang_ceiling_s(timeout_s)  # hang protection only
    while not (value := what()):
        assert time.monotonic() < deadline, "the market's indexer job did not catch up"
        time.sleep(0.1)  # polling another process's state, with a deadline
    return value


def test_market_server_on_a_v2_escrow_from_ask_to_reputation(
    world: ChainWorld, market: str
) -> None:
    provider = world.trader(world.providers[0])
    clients = [world.trader(k) for k in world.clients[:2]]
    now = int(time.time())

    served = httpx.get(market + "/v1/typed-data", timeout=10).json()
    assert served["domain"]["verifyingContract"] == world.escrow.address

    short = provider.quote(slo_ms=100, valid_until=now + 3_600, challenge_window=MIN_WINDOW - 1)
    refused = _post(market + "/v1/orders", provider.ask(now, quote=short), 422)
    assert f"minimum challenge window of {MIN_WINDOW}s" in refused["detail"]

    terms = provider.quote(slo_ms=100, valid_until=now + 3_600, challenge_window=MIN_WINDOW)
    # The market admits asks with stake and bids with escrow funds behind them.
    world.escrow.stake(provider.key, 2 * terms.stake)
    for c in clients:
        world.escrow.deposit(c.key, 4_000)
    # Only a live provider's ask matches: it heartbeats first.
    _post(market + "/v1/providers/heartbeat", provider.heartbeat(now), 200)
    _post(market + "/v1/orders", provider.ask(now, price=1_000, quantity=8, quote=terms), 201)
    deals = [
        _post(market + "/v1/orders", c.bid(now, price=1_000, quantity=4), 201)["fills"][0]["id"]
        for c in clients
    ]
    quotes = [
        provider.fill_quote(terms, client=c.address, max_spend=4_000, valid_until=now + 600)
        for c in clients
    ]
    # The first fill's quote, posted to the second deal by anyone: it names another client.
    _post(f"{market}/v1/deals/{deals[0]}/quote", provider.signed(quotes[0]), 200)
    _post(f"{market}/v1/deals/{deals[1]}/quote", provider.signed(quotes[0]), 422)
    _post(f"{market}/v1/deals/{deals[1]}/quote", provider.signed(quotes[1]), 200)

    opened = []
    for client, deal_id in zip(clients, deals, strict=True):
        record = httpx.get(f"{market}/v1/deals/{deal_id}", timeout=10).json()
        quote = Quote.from_json(record["quote"])
        assert quote.client == client.address
        signature = bytes.fromhex(record["quote_signature"][2:])
        tx = world.escrow.open_deal(client.key, quote, signature, 4_000)
        chain_deal = int(tx.event("DealOpened").args["dealId"])
        opened.append(chain_deal)
        voucher = Voucher(deal_id=chain_deal, cumulative_amount=2_000, tasks=task_bitmap([0, 1]))
        signed = voucher.sign(world.escrow.domain, client.key)
        world.escrow.redeem_voucher(provider.key, voucher, signed)

    def linked() -> list[dict[str, Any]] | None:
        records = [httpx.get(f"{market}/v1/deals/{d}", timeout=10).json() for d in deals]
        return records if all(r["status"] == "paid" for r in records) else None

    records = _until(linked)
    assert [r["chain_deal_id"] for r in records] == opened
    assert [r["paid"] for r in records] == ["2000", "2000"]

    _post(market + "/v1/providers/heartbeat", provider.heartbeat(int(time.time()) + 1), 200)
    [entry] = httpx.get(market + "/v1/providers", timeout=10).json()
    assert (entry["paid"], entry["clients"], entry["top_client_share"]) == ("4000", 2, 0.5)
