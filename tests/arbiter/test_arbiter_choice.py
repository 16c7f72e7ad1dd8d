"""Arbiters are chosen: a real arbiter advertises on a real market (signed, its terms and its
measured ruling time), the market keeps only what the arbiter signed, and a client or a
provider refuses a quote naming an arbiter it does not accept."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import pytest

from client.accounts import ClientAccount
from client.errors import DealMismatch
from contracts.chain import free_port
from contracts.evidence import arbiter_advert_digest
from contracts.messages import address_of
from contracts.orders import advert_hash, market_domain
from contracts.signing import sign_digest
from provider.arbiter.advert import post_advert
from provider.config_sections import AskConfig, SectionError
from tests import processes
from tests.contracts.builders import quote
from tests.contracts.conftest import World
from tests.polling import wait_until

from .drill import ArbiterProcess

ROOT = Path(__file__).resolve().parents[2]
FEE = 7_000


@pytest.fixture
def market_url(world: World, tmp_path: Path) -> Iterator[str]:
    """``python -m market.cli market serve`` on this test's escrow."""
    work = tmp_path / "market"
    work.mkdir()
    port = free_port()
    args = [sys.executable, "-m", "market.cli", "market", "serve", "--port", str(port)]
    args += ["--data-dir", str(work), "--rpc-url", world.anvil.url]
    args += ["--escrow", world.escrow.address, "--chain-id", str(world.escrow.domain.chain_id)]
    log = (work / "market.log").open("ab")
    process = processes.spawn(
        args, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "DATABASE_URL": ""}
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


def adverts(url: str) -> list[dict[str, Any]]:
    answer = httpx.get(url + "/v1/arbiters", timeout=10)
    assert answer.status_code == 200
    body: list[dict[str, Any]] = answer.json()
    return body


def test_arbiter_when_given_a_market_then_advertises_its_signed_terms(
    world: World, market_url: str, tmp_path: Path
) -> None:
    arbiter = ArbiterProcess(
        world,
        tmp_path / "arbiter",
        {
            "TPUMARKET_ARBITER_MARKET_URL": market_url,
            "TPUMARKET_ARBITER_FEE": str(FEE),
            "TPUMARKET_ARBITER_ADVERT_INTERVAL_S": "1",
        },
    )
    arbiter.start()
    try:
        wait_until(lambda: bool(adverts(market_url)), 120, "the arbiter's advert")
        info = httpx.get(arbiter.url + "/v1/info", timeout=10).json()
    finally:
        arbiter.stop()
    (entry,) = adverts(market_url)
    address = address_of(world.arbiter)
    assert entry["address"] == address
    advert = entry["advert"]
    assert advert["role"] == "arbiter" and advert["arbiter"] == address
    assert advert["url"] == arbiter.url and advert["fee"] == FEE == info["fee"]
    # The fee it advertises is the one the escrow charges for the deals opened from now on.
    assert world.escrow.arbiter_fee(address) == FEE
    assert advert["evidence_window_s"] == info["evidence_window_s"]
    assert advert["tolerance"]["float32"] == info["tolerance"]["float"]["float32"]
    # Nothing ruled yet: the ruling time is not claimed.
    assert advert["rulings"] == 0 and advert["ruling_s_p50"] is None
    one = httpx.get(f"{market_url}/v1/arbiters/{address}", timeout=10).json()
    assert one["advert"] == advert


def test_market_when_an_advert_is_forged_replayed_or_not_the_signers_then_refuses_it(
    world: World, market_url: str
) -> None:
    domain = market_domain(world.escrow.domain.chain_id, world.escrow.address)
    address = address_of(world.arbiter)
    advert = {
        "role": "arbiter",
        "arbiter": address,
        "url": "http://arbiter.example",
        "fee": FEE,
        "evidence_window_s": 600,
        "ruling_margin_s": 300,
        "tolerance": {"float32": {"rtol": 1e-3, "atol": 1e-4}},
        "rulings": 0,
        "ruling_s_p50": None,
    }
    # The market takes an advert stamped near its own (host) clock.
    stamp = int(time.time())
    post_advert(market_url, domain, world.arbiter, advert, timestamp=stamp)
    body = {"arbiter": address, "timestamp": stamp, "advert": advert}

    def send(**changes: Any) -> httpx.Response:
        return httpx.post(market_url + "/v1/arbiters", json={**body, **changes}, timeout=10)

    def sign(key: str, ad: dict[str, Any], ts: int) -> str:
        return "0x" + sign_digest(arbiter_advert_digest(domain, advert_hash(ad), ts), key).hex()

    # The same signed advert again is a replay.
    replay = send(signature=sign(world.arbiter, advert, stamp))
    assert replay.status_code == 409 and "not after" in replay.text, replay.text
    # Another key cannot advertise in the arbiter's name.
    forged = send(timestamp=stamp + 1, signature=sign(world.stranger, advert, stamp + 1))
    assert forged.status_code == 401 and "not by" in forged.text, forged.text
    # A fee other than the one signed is refused (the signature covers the advert).
    raised = {**advert, "fee": FEE * 10}
    tampered = send(
        timestamp=stamp + 1, advert=raised, signature=sign(world.arbiter, advert, stamp + 1)
    )
    assert tampered.status_code == 401 and "not by" in tampered.text, tampered.text
    # An advert signed by one arbiter naming another is refused.
    other = {**advert, "arbiter": address_of(world.stranger)}
    mismatched = send(
        timestamp=stamp + 1, advert=other, signature=sign(world.arbiter, other, stamp + 1)
    )
    assert mismatched.status_code == 422 and "not its signer" in mismatched.text
    (entry,) = adverts(market_url)
    assert entry["advert"]["fee"] == FEE and entry["timestamp"] == stamp


def test_client_when_the_quote_names_an_arbiter_it_does_not_accept_then_refuses_it(
    world: World,
) -> None:
    client, provider = world.clients[0], world.providers[0]
    q = quote(world, provider, client)
    chosen = ClientAccount(
        world.escrow, world.token, client, arbiters=frozenset({q.arbiter.lower()})
    )
    chosen.check_quote(q, q.max_spend)  # the arbiter it accepts
    other = replace(q, arbiter=address_of(world.stranger))
    with pytest.raises(DealMismatch, match="not one this client accepts"):
        chosen.check_quote(other, q.max_spend)
    with pytest.raises(DealMismatch, match="not one this client accepts"):
        chosen.open_deal(other, other.sign(world.escrow.domain, provider), q.max_spend)
    assert world.escrow.deal_count() == 0


def test_client_arbiters_come_from_tpumarket_arbiters(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    client = world.clients[0]
    monkeypatch.setenv("TPUMARKET_ARBITERS", f" {address_of(world.arbiter)} ,")
    account = ClientAccount(world.escrow, world.token, client)
    assert account.arbiters == frozenset({address_of(world.arbiter).lower()})
    monkeypatch.setenv("TPUMARKET_ARBITERS", "0x1234")
    with pytest.raises(ValueError, match="not an address"):
        ClientAccount(world.escrow, world.token, client)


def test_provider_ask_names_an_arbiter_it_accepts() -> None:
    a, b = "0x" + "a" * 40, "0x" + "b" * 40
    terms: dict[str, Any] = {"price": 1, "quantity": 1, "stake": 0, "penalty": 0}
    assert AskConfig(**terms, arbiter=a).accepted_arbiters() == frozenset({a})
    both = AskConfig(**terms, arbiter=a, arbiters=(a, b))
    assert both.accepted_arbiters() == frozenset({a, b})
    with pytest.raises(SectionError, match=r"ask\.arbiter must be one of ask\.arbiters"):
        AskConfig(**terms, arbiter=a, arbiters=(b,))
