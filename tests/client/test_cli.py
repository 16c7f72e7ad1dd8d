"""`tpumarket client ...` in-process against a real anvil (and a real market for deals/bids)."""

from __future__ import annotations

import argparse
import itertools
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest

import contracts.cli
from client.cli import Progress, build_parser, parse_amount, register
from client.ledger import DealLedger
from contracts.messages import ZERO_ADDRESS, Quote
from contracts.orders import Ask, market_domain, plan_kind
from tests.contracts.builders import quote
from tests.contracts.conftest import World
from tests.e2e.stack import wait_until
from tests.market.server import market_server

CHAIN_ID = "31337"
_beats = itertools.count()  # heartbeat timestamps must grow: now + a count, within the skew


@dataclass(frozen=True)
class _Entry:
    name: str

    def load(self) -> Any:
        return register


@pytest.fixture(autouse=True)
def _client_entry_point(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Make `contracts.cli.main` see `client = "client.cli:register"` as pyproject will."""
    monkeypatch.setattr(contracts.cli, "entry_points", lambda group: [_Entry("client")])
    monkeypatch.delenv("TPUMARKET_CLIENT_KEY", raising=False)
    monkeypatch.setenv("TPUMARKET_CLIENT_STATE", str(tmp_path / "client-state"))


def _cli(world: World, *argv: str, key: str | None = None, market: str | None = None) -> int:
    action, *rest = argv
    common = ["--rpc-url", world.anvil.url, "--escrow", world.escrow.address]
    if key:
        common += ["--key", key]
    if market:
        common += ["--market-url", market]
    return contracts.cli.main(["client", action, *common, *rest])


def _last_json(out: str) -> dict[str, Any]:
    value = json.loads(out.strip().splitlines()[-1])
    assert isinstance(value, dict)
    return value


@pytest.fixture
def client_key(world: World) -> str:
    """A fresh client holding 10 tokens in its wallet and nothing in the escrow."""
    key = world.anvil.new_funded_key()
    world.token.mint(world.deployer, world.addr(key), 10_000_000)
    return key


def test_amounts_parse_to_units_or_exit_2(
    world: World, client_key: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert parse_amount("1.5") == 1_500_000
    assert parse_amount("0.000001") == 1
    assert parse_amount("3") == 3_000_000
    for bad, why in (
        ("abc", "not an amount"),
        ("1.0000001", "more than 6 decimals"),
        ("-1", "positive"),
        ("0", "positive"),
        ("nan", "positive"),
    ):
        with pytest.raises(SystemExit) as exit_:
            _cli(world, "deposit", bad, key=client_key)
        assert exit_.value.code == 2
        assert why in capsys.readouterr().err
    assert world.escrow.balance_of(world.addr(client_key)) == 0


def test_deposit_withdraw_and_balances(
    world: World, client_key: str, capsys: pytest.CaptureFixture[str]
) -> None:
    address = world.addr(client_key)
    assert _cli(world, "deposit", "2.5", key=client_key) == 0
    out = capsys.readouterr()
    assert "deposit 2.500000 tokens: tx 0x" in out.out
    assert "deposit: 1/1 confirmed" in out.err  # plain progress: stderr is not a TTY
    assert world.escrow.balance_of(address) == 2_500_000
    assert world.token.balance_of(address) == 7_500_000

    assert _cli(world, "withdraw", "0.5", "--json", key=client_key) == 0
    moved = _last_json(capsys.readouterr().out)
    assert moved["action"] == "withdraw" and moved["amount"] == 500_000
    assert moved["free"] == 2_000_000 == world.escrow.balance_of(address)

    # A deal opened with a provider's quote locks 1 token.
    q = quote(world, world.providers[0], client_key, stake=0)
    world.escrow.open_deal(client_key, q, q.sign(world.escrow.domain, world.providers[0]), 10**6)

    assert _cli(world, "balances", key=client_key) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0] == f"client {address}"
    assert table[1].split() == ["balance", "tokens"]
    assert table[2:] == [
        "wallet   8.000000",
        "free     1.000000",
        "locked   1.000000",
        "total    10.000000",
    ]
    assert _cli(world, "balances", "--json", key=client_key) == 0
    assert _last_json(capsys.readouterr().out) == {
        "address": address,
        "wallet": 8_000_000,
        "free": 1_000_000,
        "locked": 1_000_000,
        "total": 10_000_000,
    }


def test_sdk_errors_exit_1_and_missing_key_exits_2(
    world: World, client_key: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _cli(world, "withdraw", "1", key=client_key) == 1
    err = capsys.readouterr().err
    assert err == "error: cannot withdraw 1.000000 tokens: the free balance is 0.000000 tokens\n"

    assert _cli(world, "balances") == 2
    assert "error: no client key: pass --key, set TPUMARKET_CLIENT_KEY" in capsys.readouterr().err


def test_key_from_environment(
    world: World,
    client_key: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("TPUMARKET_CLIENT_KEY", client_key)
    assert _cli(world, "balances", "--json") == 0
    assert _last_json(capsys.readouterr().out)["wallet"] == 10_000_000


def test_progress_draws_a_bar_only_on_a_tty() -> None:
    class Tty:
        def __init__(self, tty: bool) -> None:
            self.text, self.tty = "", tty

        def write(self, text: str) -> int:
            self.text += text
            return len(text)

        def flush(self) -> None:
            pass

        def isatty(self) -> bool:
            return self.tty

    for tty in (True, False):
        stream = Tty(tty)
        progress = Progress("scan", 2, stream)  # type: ignore[arg-type]
        progress.step("a")
        progress.step("b")
        if tty:
            assert "\r" in stream.text and "[########################] 2/2 b" in stream.text
        else:
            assert stream.text == "scan: 1/2 a\nscan: 2/2 b\n"


@pytest.fixture
def market(world: World, tmp_path: Path) -> Iterator[str]:
    data = tmp_path / "market"
    data.mkdir()
    with market_server(
        data,
        "--rpc-url",
        world.anvil.url,
        "--escrow",
        world.escrow.address,
        "--chain-id",
        CHAIN_ID,
    ) as url:
        yield url


def _post_ask(world: World, market: str, provider: str, quantity: int, price: int) -> Quote:
    """Post an ask with its signed terms (a quote naming nobody); return those terms."""
    from client.market_http import MarketHttp
    from tests.market.signing import Trader

    world.escrow.stake(provider, 10**6)  # the market lists asks of staked providers only
    q = quote(world, provider, world.clients[0], stake=0, max_spend=quantity * price)
    q = replace(q, client=ZERO_ADDRESS, valid_until=world.now() + 3_600)
    ask = Ask(
        owner=world.addr(provider),
        device_class="tpu-v5e",
        quantity=quantity,
        price=price,
        plan=plan_kind(q.plan),
        slo_ms=q.slo_ms,
        memory=0,
        expiry=q.valid_until,
        nonce=q.nonce,
        quote_hash=q.struct_hash(),
    )
    domain = market_domain(world.escrow.domain.chain_id, world.escrow.address)
    trader = Trader(key=provider, chain_id=int(CHAIN_ID), escrow=world.escrow.address)
    http = MarketHttp(market)
    try:
        # Asks match while their provider is online (one heartbeat a second at most here).
        http.heartbeat(trader.heartbeat(int(time.time()) + next(_beats)))
        http.place_order(
            ask,
            ask.sign(domain, provider),
            quote=q,
            quote_signature=q.sign(world.escrow.domain, provider),
        )
    finally:
        http.close()
    return q


def test_bid_fills_and_deals_list(
    world: World, client_key: str, market: str, capsys: pytest.CaptureFixture[str]
) -> None:
    provider = world.providers[1]
    _post_ask(world, market, provider, quantity=4, price=10_000)
    plan = plan_kind(quote(world, provider, world.clients[0]).plan)
    bid = ["--device-class", "tpu-v5e", "--quantity", "3", "--price", "0.02"]
    bid += ["--plan", plan, "--slo-ms", "5000", "--memory", "0", "--expiry-s", "600"]
    assert _cli(world, "deposit", "1", key=client_key) == 0  # the market lists funded bids only
    capsys.readouterr()
    assert _cli(world, "bid", *bid, "--json", key=client_key, market=market) == 0
    placed = _last_json(capsys.readouterr().out)
    assert placed["order_id"].startswith("0x") and placed["remaining"] == 0
    assert [(f["price"], f["quantity"]) for f in placed["fills"]] == [(10_000, 3)]

    assert _cli(world, "deals", "--json", key=client_key, market=market) == 0
    listed = _last_json(capsys.readouterr().out)
    assert listed["client"] == world.addr(client_key)
    [deal] = listed["deals"]
    assert deal["provider"].lower() == world.addr(provider).lower()
    assert (deal["price"], deal["quantity"], deal["total"]) == (10_000, 3, 30_000)

    assert _cli(world, "deals", key=client_key, market=market) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["id", "on", "chain", "provider", "price", "x", "qty", "status"]
    assert deal["deal_id"] in lines[1] and "0.010000 x 3 = 0.030000" in lines[1]
    assert lines[1].rstrip().endswith(deal["status"])

    # A bid with nothing to cross rests: table output, no fills.
    bid[bid.index("0.02")] = "0.001"
    assert _cli(world, "bid", *bid, key=client_key, market=market) == 0
    out = capsys.readouterr().out
    assert "(open, 3 unmatched)" in out and "no fills yet" in out


def test_market_unreachable_is_an_error(
    world: World, client_key: str, capsys: pytest.CaptureFixture[str]
) -> None:
    dead = "http://127.0.0.1:9"
    assert _cli(world, "deals", key=client_key, market=dead) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: market at http://127.0.0.1:9 unreachable")


def test_build_parser_lists_the_client_actions() -> None:
    parser = build_parser()
    args = parser.parse_args(["client", "deposit", "1.25", "--key", "0x01"])
    assert isinstance(args, argparse.Namespace) and args.amount == 1_250_000
    with pytest.raises(SystemExit):
        parser.parse_args(["client", "bid", "--quantity", "1"])


def _book(market: str) -> Any:
    from client.market_http import MarketHttp

    http = MarketHttp(market)
    try:
        return http.book("tpu-v5e")
    finally:
        http.close()


def test_offers_show_asks_by_level_with_depth_and_the_providers(
    world: World, client_key: str, market: str, capsys: pytest.CaptureFixture[str]
) -> None:

    provider = world.providers[0]
    _post_ask(world, market, provider, quantity=4, price=10_000)
    _post_ask(world, market, provider, quantity=2, price=12_000)

    assert _cli(world, "offers", "--device-class", "tpu-v5e", "--json", market=market) == 0
    offers = _last_json(capsys.readouterr().out)["offers"]
    plan = plan_kind(quote(world, provider, world.clients[0]).plan)
    assert [(o["price"], o["quantity"], o["plan"], o["slo_ms"]) for o in offers] == [
        (10_000, 4, plan, 2_000),
        (12_000, 2, plan, 2_000),
    ]
    assert {o["provider"].lower() for o in offers} == {world.addr(provider).lower()}
    assert offers[0]["device_kind"] == "TPU v5 lite" and offers[0]["online"]

    assert _cli(world, "offers", "--max-price", "0.011", market=market) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == [
        "class", "price", "units", "plan", "slo", "ms", "memory", "provider", "rel.", "online"
    ]  # fmt: skip
    assert lines[1].split()[:6] == ["tpu-v5e", "0.010000", "4", plan, "2000", "0"]
    assert len(lines) == 3 and lines[2].startswith("take the first: tpumarket client bid ")


def test_cancel_removes_a_bid_and_refuses_a_second_or_foreign_cancel(
    world: World, client_key: str, market: str, capsys: pytest.CaptureFixture[str]
) -> None:
    bid = ["--device-class", "tpu-v5e", "--quantity", "3", "--price", "0.001"]
    bid += ["--slo-ms", "5000", "--expiry-s", "600", "--json"]
    assert _cli(world, "deposit", "1", key=client_key) == 0  # the market lists funded bids only
    capsys.readouterr()
    _post_ask(world, market, world.providers[0], quantity=1, price=100_000)  # far above the bid
    assert _cli(world, "bid", *bid, key=client_key, market=market) == 0
    mine = _last_json(capsys.readouterr().out)["order_id"]
    assert [(lv.price, lv.quantity) for lv in _book(market).bids] == [(1_000, 3)]

    other = world.anvil.new_funded_key()
    assert _cli(world, "cancel", mine, key=other, market=market) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: cannot cancel order {mine}: it belongs to another owner")
    assert _book(market).bids

    assert _cli(world, "cancel", mine, "--json", key=client_key, market=market) == 0
    cancelled = _last_json(capsys.readouterr().out)
    assert cancelled == {"order_id": mine, "state": "cancelled", "remaining": 3, "filled": 0}
    assert _book(market).bids == ()

    assert _cli(world, "cancel", mine, key=client_key, market=market) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: cannot cancel order {mine}: it ")
    unknown = "0x" + "ab" * 32
    assert _cli(world, "cancel", unknown, key=client_key, market=market) == 2
    assert "it is not on the market" in capsys.readouterr().err
    with pytest.raises(SystemExit) as usage:
        _cli(world, "cancel", "0x12", key=client_key, market=market)
    assert usage.value.code == 2 and "not an order id" in capsys.readouterr().err


def _attach(world: World, market: str, deal_id: str, fill: Quote, provider: str) -> None:
    """As the provider's daemon does after a match: attach this fill's quote to the deal."""
    from client.market_http import MarketHttp

    http = MarketHttp(market)
    try:
        http.attach_quote(deal_id, fill, fill.sign(world.escrow.domain, provider))
    finally:
        http.close()


def test_open_waits_for_the_fills_quote_then_opens_the_deal_with_the_cap_locked(
    world: World, client_key: str, market: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    provider = world.providers[1]
    address = world.addr(client_key)
    terms = _post_ask(world, market, provider, quantity=4, price=10_000)
    assert _cli(world, "deposit", "1", key=client_key) == 0
    plan = plan_kind(terms.plan)
    bid = ["--device-class", "tpu-v5e", "--quantity", "3", "--price", "0.02", "--plan", plan]
    assert _cli(world, "bid", *bid, "--slo-ms", "5000", key=client_key, market=market) == 0
    assert _cli(world, "deals", "--json", key=client_key, market=market) == 0
    [deal] = _last_json(capsys.readouterr().out)["deals"]
    count = world.escrow.deal_count()

    other = world.anvil.new_funded_key()
    assert _cli(world, "open", deal["deal_id"], key=other, market=market) == 1
    assert f"error: deal {deal['deal_id']} is " in capsys.readouterr().err
    # The record holds the ask's terms only (a quote naming nobody) until the provider signs
    # this fill's quote: the client waits for it, a bounded time, saying so.
    wait = ["--quote-wait-s", "0.5"]
    assert _cli(world, "open", deal["deal_id"], *wait, key=client_key, market=market) == 1
    err = capsys.readouterr().err
    assert f"waiting for the provider's quote for deal {deal['deal_id']}" in err
    assert f"no quote naming {address} after 0 s" in err

    fill = replace(terms, client=address, nonce=terms.nonce + 10**6)
    _attach(world, market, deal["deal_id"], fill, provider)
    too_much = ["--max-spend", "0.05"]  # the quote allows 4 x 0.01
    assert _cli(world, "open", deal["deal_id"], *too_much, key=client_key, market=market) == 1
    assert "outside the quote's (0, 0.040000]" in capsys.readouterr().err
    assert world.escrow.deal_count() == count
    assert world.escrow.balance_of(address) == 1_000_000

    cap = ["--max-spend", "0.02", "--json"]
    assert _cli(world, "open", deal["deal_id"], *cap, key=client_key, market=market) == 0
    opened = _last_json(capsys.readouterr().out)
    assert opened == {
        "deal_id": deal["deal_id"],
        "chain_deal_id": count + 1,
        "provider": opened["provider"],
        "max_spend": 20_000,
        "locked": 20_000,
    }
    assert opened["provider"].lower() == world.addr(provider).lower()
    on_chain = world.escrow.get_deal(count + 1)
    assert on_chain.client.lower() == address.lower() and on_chain.locked == 20_000
    assert world.escrow.balance_of(address) == 1_000_000 - 20_000
    assert world.token.balance_of(address) == 9_000_000
    # The deal's ledger knows the block it opened in: its claims are read from there on.
    ledger = DealLedger.open(
        tmp_path / "client-state", world.escrow.domain.chain_id, world.escrow.address, count + 1
    )
    assert ledger.open_block == world.chain.w3.eth.block_number
    ledger.close()

    # The fill's quote opens one deal: a second open is refused and locks nothing more.
    assert _cli(world, "open", deal["deal_id"], key=client_key, market=market) == 1
    assert capsys.readouterr().err.startswith("error: ")
    assert world.escrow.balance_of(address) == 1_000_000 - 20_000

    # The client's orders: its bid, filled.
    assert _cli(world, "orders", "--json", key=client_key, market=market) == 0
    orders = _last_json(capsys.readouterr().out)["orders"]
    assert [(o["side"], o["state"], o["filled"], o["plan"]) for o in orders] == [
        ("bid", "filled", 3, plan)
    ]
    assert _cli(world, "orders", "--live", key=client_key, market=market) == 0
    assert capsys.readouterr().out.startswith("no live orders for ")

    # Closed by its market id, once the market's indexer has seen it open on chain.
    def indexed() -> bool:
        from client.market_http import MarketHttp

        http = MarketHttp(market)
        try:
            return http.deal(deal["deal_id"]).get("chain_deal_id") == count + 1
        finally:
            http.close()

    wait_until(indexed, 60, "the market indexing the deal")
    assert _cli(world, "close", deal["deal_id"], "--json", key=client_key, market=market) == 0
    closed = _last_json(capsys.readouterr().out)
    assert (closed["deal_id"], closed["closed"], closed["returned"]) == (count + 1, False, 0)
    assert world.escrow.get_deal(count + 1).client_agreed_close
