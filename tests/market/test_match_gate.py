"""What may trade: a real market server on a real anvil with a v2 escrow matches a bid only as
far as its owner's free escrow balance covers it, and an ask only while its provider
heartbeats (`market.match_gate.MatchGate`).

Admission already refuses a bid its owner cannot cover; these are the cases admission cannot
see: a wallet emptied after its bids rest, bids that together outgrow what is left, and a
provider whose daemon stopped after its ask rested.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from contracts.chain import Anvil
from tests.polling import wait_until

from .chain import MIN_WINDOW, ChainWorld, deploy_world
from .server import market_server
from .signing import Trader

STAKE = 1_000_000  # the market's default minimum provider stake
TTL_S = 15  # the market's provider TTL here (`--provider-ttl`)
# Every step that needs a live provider heartbeats just before it, so the TTL is the most a
# loaded host may take between one beat and the next request; only the test of a silent
# provider waits it out, by watching the book, not a clock.
REMATCH_S = 2.0  # the market's default `rematch_every_s`


@pytest.fixture(scope="module")
def world() -> Iterator[ChainWorld]:
    with Anvil.start(accounts=10) as anvil:
        yield deploy_world(anvil)


@pytest.fixture(scope="module")
def url(world: ChainWorld, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    data_dir = tmp_path_factory.mktemp("gate") / "data"
    flags = ["--rpc-url", world.anvil.url, "--escrow", world.escrow.address, "--chain-id", "31337"]
    # Every group reads the chain head (not once per 50 ms): a withdrawal mined just before an
    # order is seen by its group, whatever the host's pace (`tests/market/test_gate_head.py`
    # tests the window the default leaves).
    flags += ["--head-max-age", "0"]
    with market_server(data_dir, *flags, "--provider-ttl", str(TTL_S)) as served:
        yield served


def _fresh(world: ChainWorld) -> Trader:
    key = "0x" + os.urandom(32).hex()
    world.fund(key)
    return world.trader(key)


def _post(url: str, path: str, body: dict[str, Any], status: int) -> dict[str, Any]:
    response = httpx.post(url + path, json=body, timeout=30)
    assert response.status_code == status, response.text
    reply: dict[str, Any] = response.json()
    return reply


_LAST_BEAT: dict[str, int] = {}


def _beat(url: str, provider: Trader, device_class: str) -> float:
    """Heartbeat `provider`; return when the market had answered it (its clock is this host's),
    so no later than when it recorded it. A heartbeat's whole-second timestamp must pass the
    previous one's: wait for the next second if needed."""
    while int(time.time()) <= _LAST_BEAT.get(provider.address, -1):
        time.sleep(0.05)
    sent = time.time()
    _LAST_BEAT[provider.address] = int(sent)
    _post(
        url,
        "/v1/providers/heartbeat",
        provider.heartbeat(int(sent), device_class=device_class),
        200,
    )
    return time.time()


def _provider(world: ChainWorld, url: str, device_class: str) -> Trader:
    provider = _fresh(world)
    world.escrow.stake(provider.key, 2 * STAKE)
    _beat(url, provider, device_class)
    return provider


def _ask(url: str, provider: Trader, device_class: str, *, quantity: int) -> dict[str, Any]:
    _beat(url, provider, device_class)  # its daemon heartbeats all along
    now = int(time.time())
    quote = provider.quote(slo_ms=100, valid_until=now + 3_600, challenge_window=MIN_WINDOW)
    body = provider.ask(now, price=100, quantity=quantity, quote=quote, device_class=device_class)
    return _post(url, "/v1/orders", body, 201)


def _bid(url: str, client: Trader, device_class: str, *, quantity: int) -> dict[str, Any]:
    body = client.bid(int(time.time()), price=100, quantity=quantity, device_class=device_class)
    return _post(url, "/v1/orders", body, 201)


def _order(url: str, order_id: str) -> dict[str, Any]:
    reply: dict[str, Any] = httpx.get(f"{url}/v1/orders/{order_id}", timeout=10).json()
    return reply


def test_bid_when_its_wallet_was_emptied_after_it_rested_then_it_never_fills(
    world: ChainWorld, url: str
) -> None:
    name = "gate-empty"
    provider = _provider(world, url, name)
    client = _fresh(world)
    world.escrow.deposit(client.key, 600)
    bid = _bid(url, client, name, quantity=6)["order"]  # admitted: 600 covers it
    world.escrow.withdraw(client.key, 600)  # the wallet is empty, the bid rests
    # The provider's last 6 units, at the bid's price: the empty wallet takes none of them.
    ask = _ask(url, provider, name, quantity=6)
    assert ask["fills"] == [] and ask["order"]["state"] == "open"
    assert _order(url, bid["order_id"])["remaining"] == 6
    # A funded client behind it gets them.
    other = _fresh(world)
    world.escrow.deposit(other.key, 600)
    placed = _bid(url, other, name, quantity=6)
    assert [(f["ask_id"], f["quantity"]) for f in placed["fills"]] == [
        (ask["order"]["order_id"], 6)
    ]
    assert _order(url, bid["order_id"])["state"] == "open"


def test_two_bids_when_together_they_outgrow_the_wallet_then_they_fill_only_up_to_it(
    world: ChainWorld, url: str
) -> None:
    name = "gate-two"
    provider = _provider(world, url, name)
    client = _fresh(world)
    world.escrow.deposit(client.key, 2_000)
    first = _bid(url, client, name, quantity=10)["order"]
    second = _bid(url, client, name, quantity=10)["order"]  # 2,000 covered both at admission
    world.escrow.withdraw(client.key, 1_300)  # 700 left: 7 units at 100
    ask = _ask(url, provider, name, quantity=20)
    assert [(f["bid_id"], f["quantity"]) for f in ask["fills"]] == [(first["order_id"], 7)]
    assert (ask["order"]["state"], ask["order"]["remaining"]) == ("partially_filled", 13)
    assert _order(url, first["order_id"])["remaining"] == 3
    assert _order(url, second["order_id"])["remaining"] == 10
    # Its unopened deal's 700 stays counted: a deposit of 500 pays for 5 more units, not 12,
    # matched again against the resting ask without a new order.
    world.escrow.deposit(client.key, 500)

    def matched() -> bool:
        _beat(url, provider, name)  # its daemon heartbeats all along
        return _remaining(url, first, second) == 8

    wait_until(matched, 30, "the funded bids matched again")
    again = _ask(url, provider, name, quantity=20)
    assert again["fills"] == []
    time.sleep(2 * REMATCH_S)
    assert _remaining(url, first, second) == 8  # and never more than the wallet pays for


def _book(url: str, name: str) -> dict[str, Any]:
    reply: dict[str, Any] = httpx.get(f"{url}/v1/book/{name}", timeout=10).json()
    return reply


def _remaining(url: str, *orders: dict[str, Any]) -> int:
    return sum(int(_order(url, o["order_id"])["remaining"]) for o in orders)


def test_bid_when_its_owner_deposits_after_it_rested_then_it_fills_without_a_new_order(
    world: ChainWorld, url: str
) -> None:
    name = "gate-refund"
    provider = _provider(world, url, name)
    client = _fresh(world)
    world.escrow.deposit(client.key, 600)
    bid = _bid(url, client, name, quantity=6)["order"]
    world.escrow.withdraw(client.key, 600)
    ask = _ask(url, provider, name, quantity=6)["order"]
    time.sleep(2 * REMATCH_S)
    assert _order(url, bid["order_id"])["remaining"] == 6  # crossed, but it cannot pay
    # The book shows only bids their owners can pay for: this one leaves it once its owner's
    # balance is read again (every rematch_every_s), and comes back with the deposit.
    wait_until(lambda: _book(url, name)["bids"] == [], 30, "the unpaid bid out of the book")
    world.escrow.deposit(client.key, 600)

    def matched() -> bool:
        _beat(url, provider, name)  # its daemon heartbeats all along
        return bool(_order(url, bid["order_id"])["state"] == "filled")

    wait_until(matched, 30, "the bid matched again")
    assert _order(url, ask["order_id"])["state"] == "filled"
    book = _book(url, name)
    assert book["bids"] == [] and book["asks"] == []  # nothing left crossed


def test_ask_when_its_provider_stops_heartbeating_then_it_stops_matching_until_it_beats(
    world: ChainWorld, url: str
) -> None:
    name = "gate-live"
    provider = _provider(world, url, name)
    client = _fresh(world)
    world.escrow.deposit(client.key, 10_000)
    ask = _ask(url, provider, name, quantity=10)["order"]
    _beat(url, provider, name)
    assert len(_bid(url, client, name, quantity=1)["fills"]) == 1  # live: it trades
    answered = _beat(url, provider, name)  # then its daemon stops
    # The market counts a provider live while its last beat >= int(now) - TTL_S: that passes.
    wait_until(lambda: int(time.time()) - TTL_S > answered, 2 * TTL_S, "the TTL since its beat")
    silent = _bid(url, client, name, quantity=1)
    assert silent["fills"] == [] and silent["order"]["state"] == "open"
    assert _order(url, ask["order_id"])["remaining"] == 9
    _beat(url, provider, name)  # the daemon is back: the bid resting against its ask trades
    assert _order(url, silent["order"]["order_id"])["state"] == "filled"
    assert _order(url, ask["order_id"])["remaining"] == 8
    placed = _bid(url, client, name, quantity=1)
    assert [f["ask_id"] for f in placed["fills"]] == [ask["order_id"]]
