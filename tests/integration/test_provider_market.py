"""The provider daemon's heartbeat is accepted by a real market server, and a forged one is not."""

from __future__ import annotations

from pathlib import Path

import httpx

from client.market_http import MarketHttp
from contracts.messages import Domain, Plan, address_of
from provider.heartbeat import Heartbeat, build_advert, signed_heartbeat
from provider.metrics import ProviderMetrics
from tests.market.server import market_server
from tests.market.signing import CHAIN_ID, ESCROW

KEY = "0x" + "5a" * 32
PLAN = Plan(compile_price=1_000, inference_price=500)


def test_provider_heartbeat_registers_on_a_real_market(tmp_path: Path) -> None:
    domain = Domain(chain_id=CHAIN_ID, verifying_contract=ESCROW)
    advert = build_advert(
        capacity=None, plan=PLAN, slo_ms=2_000, endpoint="http://p:1", domain=domain
    )
    with market_server(tmp_path / "market") as url:
        beat = Heartbeat(
            MarketHttp(url),
            private_key=KEY,
            provider=address_of(KEY),
            advert=advert,
            domain=domain,
            metrics=ProviderMetrics(),
        )
        assert beat.beat() is True
        listed = httpx.get(url + "/v1/providers").json()
        assert [(p["address"], p["endpoint"], p["price"]) for p in listed] == [
            (address_of(KEY), "http://p:1", 500)
        ]

        other_escrow = Domain(chain_id=CHAIN_ID, verifying_contract="0x" + "11" * 20)
        forged = signed_heartbeat(KEY, address_of(KEY), advert, other_escrow)
        response = httpx.post(url + "/v1/providers/heartbeat", json=forged)
        assert response.status_code == 401, response.text
