"""Per-fill quotes, minimum windows and typed data against a real v2 escrow on anvil."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from eth_account.messages import _hash_eip191_message, encode_typed_data
from fastapi.testclient import TestClient

from contracts.chain import free_port
from contracts.messages import Ack, Quote, Receipt, TaskRequest, Voucher, task_bitmap
from market.api.app import create_app
from market.errors import ChainUnavailableError, ChallengeWindowTooShortError, ReplayError
from market.indexer import Indexer
from market.models import OrderCreate
from market.service import MarketService
from market.settings import Settings

from . import chain as fixtures
from .chain import (
    MIN_WINDOW,
    ChainWorld,
    ack_of,
    attach,
    claim_of,
    deal_quote,
    fund,
    match,
    open_on_chain,
    task_request,
)
from .conftest import Clock

chain_session = fixtures.chain_session
world = fixtures.world
market = fixtures.market


def test_one_ask_fills_two_clients_and_each_opens_with_the_quote_of_its_fill(
    world: ChainWorld, market: MarketService
) -> None:
    provider = world.trader(world.providers[0])
    first, second = (world.trader(k) for k in world.clients[:2])
    now = market.now()
    terms = provider.quote(slo_ms=100, valid_until=now + 3_600, challenge_window=MIN_WINDOW)
    ask = provider.ask(now, price=1_000, quantity=8, quote=terms)
    for client in (first, second):
        fund(world, market, provider=provider.key, client=client.key, spend=4_000, stake=0)
    market.place([OrderCreate.model_validate(ask)])
    deals = []
    for client in (first, second):
        body = client.bid(now, price=1_000, quantity=4)
        [bid] = market.place([OrderCreate.model_validate(body)])
        deals.append(bid.fills[0].id)
    opened = []
    for client, deal_id in zip((first, second), deals, strict=True):
        assert market.deal(deal_id).quote is None  # nothing to open with before the fill's quote
        fill = deal_quote(provider, terms, client.address, 4_000, market.now() + 600)
        attach(market, deal_id, fill, provider.key)
        opened.append(open_on_chain(world, market, deal_id, client.key, provider.key))
    Indexer(market, rpc_url=world.anvil.url, escrow=world.escrow.address).run_once()
    assert [market.deal(d).chain_deal_id for d in deals] == opened
    assert [world.escrow.get_deal(i).client for i in opened] == [first.address, second.address]


def test_attach_quote_when_its_nonce_was_used_on_chain_then_409(
    world: ChainWorld, market: MarketService
) -> None:
    """The provider signed this client a quote it opened outside the market; its calldata is
    public. Posting it to the client's market deal would leave that deal unopenable."""
    provider, client = world.trader(world.providers[0]), world.trader(world.clients[0])
    deal_id, terms = match(world, market, provider, client)
    direct = deal_quote(provider, terms, client.address, 10_000, market.now() + 600)
    world.escrow.deposit(client.key, 10_000)
    world.escrow.stake(provider.key, direct.stake)
    world.escrow.open_deal(client.key, direct, direct.sign(world.escrow.domain, provider.key), 1)
    with pytest.raises(ReplayError, match="used on chain"):
        attach(market, deal_id, direct, provider.key)
    assert market.deal(deal_id).quote is None


def test_attach_quote_when_the_held_quote_expired_but_opened_a_deal_then_409(
    world: ChainWorld, market: MarketService
) -> None:
    """Expired "unused" is checked on chain: a quote used before its expiry, not yet indexed,
    keeps the deal's record, so the indexer can still link the deal it opened."""
    provider, client = world.trader(world.providers[0]), world.trader(world.clients[0])
    deal_id, terms = match(world, market, provider, client)
    first = deal_quote(provider, terms, client.address, 10_000, market.now() + 30)
    attach(market, deal_id, first, provider.key)
    chain_deal = open_on_chain(world, market, deal_id, client.key, provider.key)
    clock = market.clock
    assert isinstance(clock, Clock)
    clock.advance(60)
    second = deal_quote(provider, terms, client.address, 10_000, market.now() + 600)
    with pytest.raises(ReplayError, match="its expired quote cannot open a deal"):
        attach(market, deal_id, second, provider.key)
    Indexer(market, rpc_url=world.anvil.url, escrow=world.escrow.address).run_once()
    assert market.deal(deal_id).chain_deal_id == chain_deal


def test_ask_when_window_below_the_escrows_minimum_then_refused_with_the_chains_figure(
    world: ChainWorld, market: MarketService
) -> None:
    provider = world.trader(world.providers[0])
    now = market.now()
    short = provider.quote(slo_ms=100, valid_until=now + 3_600, challenge_window=MIN_WINDOW - 1)
    world.escrow.stake(provider.key, market.settings.min_provider_stake)
    with TestClient(create_app(service=market)) as api:
        response = api.post("/v1/orders", json=provider.ask(now, quote=short))
        assert response.status_code == 422, response.text
        assert response.json()["error"] == "ChallengeWindowTooShortError"
        assert f"minimum challenge window of {MIN_WINDOW}s" in response.json()["detail"]
        enough = replace(short, challenge_window=MIN_WINDOW, nonce=next(provider.nonces))
        assert api.post("/v1/orders", json=provider.ask(now, quote=enough)).status_code == 201
    assert market.escrow.min_challenge_window() == world.escrow.min_challenge_window() == MIN_WINDOW


def test_ask_when_the_chain_is_down_then_503_and_accepted_once_it_answers(
    world: ChainWorld, tmp_path: Path
) -> None:
    settings = Settings(
        data_dir=tmp_path / "data",
        chain_id=world.anvil.chain_id,
        escrow=world.escrow.address,
        rpc_url=f"http://127.0.0.1:{free_port()}",  # nobody answers yet
        run_jobs=False,
    )
    service = MarketService(settings, clock=Clock(world.now()))
    try:
        provider = world.trader(world.providers[0])
        body = provider.ask(service.now())
        with pytest.raises(ChainUnavailableError):
            service.place([OrderCreate.model_validate(body)])
        with TestClient(create_app(service=service)) as api:
            assert api.post("/v1/orders", json=provider.ask(service.now())).status_code == 503
            service.settings.rpc_url = world.anvil.url
            world.escrow.stake(provider.key, settings.min_provider_stake)
            assert api.post("/v1/orders", json=body).status_code == 201
        with pytest.raises(ChallengeWindowTooShortError):
            short = provider.quote(
                slo_ms=100, valid_until=service.now() + 3_600, challenge_window=1
            )
            service.place([OrderCreate.model_validate(provider.ask(service.now(), quote=short))])
    finally:
        service.close()


def _types_for(types: dict[str, Any], primary: str) -> dict[str, Any]:
    """Return the domain type, `primary` and the struct types it refers to (eth-account wants
    exactly those; eth_signTypedData_v4 wallets walk them the same way)."""
    wanted, stack = {"EIP712Domain"}, [primary]
    while stack:
        name = stack.pop()
        if name not in wanted:
            wanted.add(name)
            stack += [f["type"] for f in types[name] if f["type"] in types]
    return {name: types[name] for name in wanted}


def _digest(served: dict[str, Any], primary: str, message: Any) -> bytes:
    """Return the EIP-712 digest a wallet computes from the served schema alone."""
    full = {
        "types": _types_for(served["types"], primary),
        "primaryType": primary,
        "domain": served["domain"],
        "message": message.as_typed_data(),
    }
    return bytes(_hash_eip191_message(encode_typed_data(full_message=full)))


def test_typed_data_served_by_the_market_gives_the_escrows_digest_for_every_message(
    world: ChainWorld, market: MarketService
) -> None:
    with TestClient(create_app(service=market)) as api:
        served = api.get("/v1/typed-data").json()
    assert served["domain"]["verifyingContract"] == world.escrow.address
    assert served["domain"]["chainId"] == world.anvil.chain_id
    provider, client = world.trader(world.providers[0]), world.trader(world.clients[0])
    quote = provider.quote(slo_ms=100, valid_until=world.now() + 600, client=client.address)
    request = task_request(7, 3, deadline=world.now() + 30, max_price=900)
    claim = claim_of(world, request, quote.plan, client.key)
    messages: dict[str, Quote | TaskRequest | Ack | Receipt | Voucher] = {
        "Quote": quote,
        "TaskRequest": request,
        "Ack": ack_of(request, 800),
        "Receipt": claim.receipt,
        "Voucher": Voucher(deal_id=7, cumulative_amount=900, tasks=task_bitmap([0, 3, 300])),
    }
    assert set(served["primaryTypes"]) == set(messages)
    for primary, message in messages.items():
        assert _digest(served, primary, message) == world.escrow.digest(message), primary
