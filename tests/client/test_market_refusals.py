"""Market refusals name the fix: in-process `tpumarket client ...` against a real market and anvil.

A bid in a class nobody sells names the classes sold (and the compile class that does a compile
check); a bid that would match an ask with a challenge window below the client's minimum is
refused before it is placed; every error status the market answers is one line and exit 2.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from client.cli import guarded
from client.market_cli import refusal, refusals_exit_2
from client.market_http import MarketHttp, MarketHttpError
from contracts.messages import ZERO_ADDRESS
from contracts.orders import Ask, market_domain, plan_kind
from market.api.errors import DESCRIPTIONS
from tests.client.test_cli import (  # noqa: F401 (fixtures)
    CHAIN_ID,
    _beats,
    _cli,
    _client_entry_point,
    _last_json,
)
from tests.contracts.builders import quote
from tests.contracts.conftest import World
from tests.market.server import market_server
from tests.market.signing import Trader


def _serve(world: World, tmp_path: Path, name: str) -> Iterator[str]:
    data = tmp_path / name
    data.mkdir()
    chain = ["--rpc-url", world.anvil.url, "--escrow", world.escrow.address]
    with market_server(data, *chain, "--chain-id", CHAIN_ID) as url:
        yield url


@pytest.fixture
def client_key(world: World) -> str:
    """A fresh client holding 10 tokens in its wallet and nothing in the escrow."""
    key = world.anvil.new_funded_key()
    world.token.mint(world.deployer, world.addr(key), 10_000_000)
    return key


@pytest.fixture
def market(world: World, tmp_path: Path) -> Iterator[str]:
    yield from _serve(world, tmp_path, "market")


def _ask(
    world: World, market: str, provider: str, device_class: str, price: int, window: int = 60
) -> None:
    """Post a staked provider's ask in `device_class` with a quote of this challenge window."""
    world.escrow.stake(provider, 10**6)
    q = quote(world, provider, world.clients[0], stake=0, max_spend=4 * price)
    q = replace(q, client=ZERO_ADDRESS, valid_until=world.now() + 3_600, challenge_window=window)
    ask = Ask(
        owner=world.addr(provider),
        device_class=device_class,
        quantity=4,
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
        http.heartbeat(trader.heartbeat(int(time.time()) + next(_beats), device_class=device_class))
        http.place_order(
            ask,
            ask.sign(domain, provider),
            quote=q,
            quote_signature=q.sign(world.escrow.domain, provider),
        )
    finally:
        http.close()


def _one_error(err: str) -> str:
    """Return the one `error: ...` line, the last of stderr (progress notes may come before)."""
    assert "Traceback" not in err, err
    lines = [line for line in err.splitlines() if line.startswith("error: ")]
    assert len(lines) == 1 and err.rstrip().endswith(lines[0]), err
    return lines[0]


def _bids(market: str, device_class: str) -> int:
    http = MarketHttp(market)
    try:
        return sum(level.quantity for level in http.book(device_class).bids)
    finally:
        http.close()


def test_bid_in_a_class_nobody_sells_names_the_classes_sold_and_the_compile_class(
    world: World, client_key: str, market: str, capsys: pytest.CaptureFixture[str]
) -> None:
    _ask(world, market, world.providers[0], "compile-v5e", price=10_000)
    assert _cli(world, "deposit", "1", key=client_key) == 0  # funded: the class is what is wrong
    capsys.readouterr()
    bid = ["--device-class", "tpu-v5e", "--quantity", "1", "--price", "0.02"]
    assert _cli(world, "bid", *bid, key=client_key, market=market) == 2
    captured = capsys.readouterr()
    line = _one_error(captured.err)
    assert "no provider sells device class 'tpu-v5e' on this market" in line
    assert "classes sold: compile-v5e" in line
    assert "--device-class compile-v5e" in line
    assert "the bid rests" not in captured.err and captured.out == ""

    assert _cli(world, "offers", "--device-class", "tpu-v5e", market=market) == 0
    assert capsys.readouterr().out == "no offers in tpu-v5e; classes sold: compile-v5e\n"

    bid[1] = "compile-v5e"  # the fix it names works as printed
    assert _cli(world, "bid", *bid, "--json", key=client_key, market=market) == 0
    assert _last_json(capsys.readouterr().out)["deals"] == ["compile-v5e:1"]


def test_a_bid_that_would_match_a_window_below_the_minimum_is_refused_before_it_is_placed(
    world: World, client_key: str, market: str, capsys: pytest.CaptureFixture[str]
) -> None:
    provider = world.providers[1]
    _ask(world, market, provider, "tpu-v5e", price=10_000, window=30)
    assert _cli(world, "deposit", "1", key=client_key) == 0
    capsys.readouterr()
    bid = ["--device-class", "tpu-v5e", "--quantity", "1", "--price", "0.02", "--json"]
    assert _cli(world, "bid", *bid, key=client_key, market=market) == 2
    line = _one_error(capsys.readouterr().err)
    assert "whose challenge window is 30 s, below your minimum of 60 s" in line
    assert "--min-window 30" in line and "bid below 0.010000" in line
    assert _bids(market, "tpu-v5e") == 0  # nothing placed

    # Below the short-window ask's price it rests; accepting the window, it matches.
    assert _cli(world, "bid", *bid[:5], "0.005", "--json", key=client_key, market=market) == 0
    assert _last_json(capsys.readouterr().out)["fills"] == []
    assert _cli(world, "bid", *bid, "--min-window", "30", key=client_key, market=market) == 0
    assert len(_last_json(capsys.readouterr().out)["fills"]) == 1


def test_market_errors_met_by_client_commands_are_one_line_exit_2(
    world: World, client_key: str, market: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # 404: a market deal id the market does not know (was a raw JSON body, exit 1).
    assert _cli(world, "open", "cpu:77", key=client_key, market=market) == 2
    assert _one_error(capsys.readouterr().err) == (
        "error: the market knows no deal cpu:77: `tpumarket client deals` lists yours, "
        "`tpumarket client bid` makes one"
    )
    assert _cli(world, "close", "cpu:77", key=client_key, market=market) == 2
    assert "the market knows no deal cpu:77" in _one_error(capsys.readouterr().err)
    # 422: a class name the market's API refuses.
    assert _cli(world, "offers", "--device-class", "Not A Class", market=market) == 2
    line = _one_error(capsys.readouterr().err)
    assert line.startswith("error: the market found the request invalid (HTTP 422: ")
    # 409: the same signed bid twice (its nonce used).
    _ask(world, market, world.providers[0], "tpu-v5e", price=100_000)
    assert _cli(world, "deposit", "1", key=client_key) == 0
    bid = ["--device-class", "tpu-v5e", "--quantity", "1", "--price", "0.001", "--nonce", "7"]
    bid += ["--plan", "flat", "--slo-ms", "5000"]
    assert _cli(world, "bid", *bid, key=client_key, market=market) == 0
    capsys.readouterr()
    assert _cli(world, "bid", *bid, key=client_key, market=market) == 2
    line = _one_error(capsys.readouterr().err)
    assert "pass a new --nonce" in line and "(HTTP 409: " in line and "{" not in line


def test_a_quota_and_a_rate_limit_are_one_line_exit_2(
    world: World,
    client_key: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("TPUMARKET_MARKET_MAX_LIVE_ORDERS_PER_OWNER", "1")
    monkeypatch.setenv("TPUMARKET_MARKET_RATE_PER_IP", "0.001")
    monkeypatch.setenv("TPUMARKET_MARKET_BURST_PER_IP", "60")
    for market in _serve(world, tmp_path, "strict"):
        _ask(world, market, world.providers[2], "tpu-v5e", price=100_000)
        assert _cli(world, "deposit", "1", key=client_key) == 0
        bid = ["--device-class", "tpu-v5e", "--quantity", "1", "--price", "0.001"]
        bid += ["--plan", "flat", "--slo-ms", "5000"]
        assert _cli(world, "bid", *bid, key=client_key, market=market) == 0
        capsys.readouterr()
        assert _cli(world, "bid", *bid, key=client_key, market=market) == 2  # 403: quota
        line = _one_error(capsys.readouterr().err)
        assert "(HTTP 403: " in line and "would hold 2 live orders" in line
        codes: list[int] = []
        while not codes or codes[-1] == 0:  # until the IP's bucket runs dry: 429
            codes.append(_cli(world, "offers", market=market))
            assert len(codes) <= 60
        assert codes[-1] == 2
        line = _one_error(capsys.readouterr().err)
        assert line.startswith("error: the market limits this caller's rate: retry after the wait")
        assert "(HTTP 429: rate limit exceeded for 127.0.0.1; retry after " in line


@pytest.mark.parametrize("status", sorted({*DESCRIPTIONS, 500, 502}))
def test_every_status_the_market_documents_reads_as_one_line_with_exit_2(
    status: int, capsys: pytest.CaptureFixture[str]
) -> None:
    body = '{"error":"SomeError","detail":"why\\nit failed","problems":[]}'

    def handler(args: object) -> int:
        raise MarketHttpError(f"GET /v1/x: {status} {body}", status, "why\nit failed")

    assert guarded(refusals_exit_2(handler))(argparse.Namespace(config=None)) == 2
    line = _one_error(capsys.readouterr().err)
    assert line.endswith(f"(HTTP {status}: why it failed)") and "{" not in line
    assert str(refusal(MarketHttpError("x", status, "d"))).count("\n") == 0
