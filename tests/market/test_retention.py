"""History past its retention is deleted; what is live, and what guards new fills, stays."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from market.api.app import create_app
from market.jobs import prune_history
from market.service import MarketService
from market.settings import Settings

from .conftest import START, Clock
from .signing import Trader

DAY = 86_400


@pytest.fixture
def kept(settings: Settings, clock: Clock) -> Iterator[tuple[MarketService, TestClient]]:
    service = MarketService(
        settings.model_copy(update={"fills_retention_days": 1, "orders_retention_days": 1}),
        clock=clock,
    )
    with TestClient(create_app(service=service)) as client:
        yield service, client
    service.close()


def place(client: TestClient, body: dict[str, Any]) -> dict[str, Any]:
    response = client.post("/v1/orders", json=body)
    assert response.status_code == 201, response.text
    result: dict[str, Any] = response.json()
    return result


def test_retention_when_history_ages_then_old_fills_and_untraded_orders_go_deals_stay(
    kept: tuple[MarketService, TestClient], clock: Clock, alice: Trader, bob: Trader
) -> None:
    service, client = kept
    place(client, bob.ask(START, price=90, quantity=5, expiry=START + 10 * DAY))
    old_bid = alice.bid(START, price=95, quantity=1, expiry=START + 60)
    placed = place(client, old_bid)
    old_deal, old_deal_bid = placed["fills"][0]["id"], placed["order"]["order_id"]
    stale = place(client, alice.bid(START, price=10, quantity=1, expiry=START + 60))
    clock.advance(3 * DAY)
    service.expire_orders()
    now = int(clock.now)
    newest = place(client, alice.bid(now, price=95, quantity=1, expiry=now + 60))["fills"][0]

    assert prune_history(service) == (1, 1)  # the old fill; the bid expired untraded
    assert prune_history(service) == (0, 0)

    assert [f["id"] for f in client.get("/v1/fills").json()] == [newest["id"]]
    assert client.get(f"/v1/orders/{stale['order']['order_id']}").status_code == 404
    assert client.get(f"/v1/deals/{old_deal}").status_code == 200  # its orders traded: kept
    assert client.get(f"/v1/orders/{old_deal_bid}").status_code == 200
    live = client.get("/v1/orders", params={"owner": bob.address}).json()
    assert [o["state"] for o in live] == ["partially_filled"]
    # An aged order cannot come back: its signature expired with it.
    assert client.post("/v1/orders", json=old_bid).status_code in (400, 401, 409, 422)
    # Fill ids go on after the newest fill kept (a fill's id is its deal's).
    clock.advance(3 * DAY)
    assert prune_history(service) == (0, 0)  # the newest fill of the class stays
    later = int(clock.now)
    again = place(client, alice.bid(later, price=95, quantity=1, expiry=later + 60))
    assert again["fills"][0]["id"] != newest["id"]
