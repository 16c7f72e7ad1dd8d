"""`POST /v1/orders` served by `market.api.fast.FastOrders` answers exactly what the FastAPI
route of the same path answers: the same statuses, bodies and headers, for good and bad orders.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from market.api.app import create_app
from market.api.fast import FastOrders, encode_result
from market.models import OrderCreate
from market.presenters import place_results
from market.service import MarketService

from .conftest import START
from .signing import Trader


@pytest.fixture
def pair(service: MarketService) -> Iterator[tuple[TestClient, TestClient]]:
    """A client of the app as served (fast route) and one of the same app without it."""
    fast = create_app(service=service)
    framework = create_app(service=service, fast_orders=False)
    assert isinstance(fast.fast, FastOrders)
    assert framework.fast is None
    with TestClient(fast) as a, TestClient(framework) as b:
        yield a, b


def _cases(trader: Trader) -> list[tuple[str, bytes, dict[str, str]]]:
    json_type = {"content-type": "application/json"}
    good = trader.bid(START, price=50)
    forged = {**trader.bid(START, price=51), "owner": Trader(key="0x" + "43" * 32).address}
    expired = trader.bid(START, price=52, expiry=START - 1)
    extra = {**trader.bid(START, price=53), "surprise": 1}
    return [
        ("good", json.dumps(good).encode(), json_type),
        ("replayed", json.dumps(good).encode(), json_type),
        ("forged", json.dumps(forged).encode(), json_type),
        ("expired", json.dumps(expired).encode(), json_type),
        ("extra field", json.dumps(extra).encode(), json_type),
        ("not json", b"{nope", json_type),
        ("deep", b"[" * 100 + b"]" * 100, json_type),
        ("wrong type", json.dumps(good).encode(), {"content-type": "text/plain"}),
        ("no type", json.dumps(good).encode(), {}),
        ("too large", b" " * (17 << 10), json_type),
    ]


def test_fast_route_when_any_order_is_posted_then_it_answers_as_the_framework_route(
    pair: tuple[TestClient, TestClient],
) -> None:
    fast, framework = pair
    answers: list[list[Any]] = []
    for client in (fast, framework):
        trader = Trader(key="0x" + "42" * 32)  # the same orders, signed again
        mine = []
        for name, body, headers in _cases(trader):
            if name == "good" and client is framework:
                body = json.dumps(trader.bid(START, price=50, nonce=10**6)).encode()
            response = client.post("/v1/orders", content=body, headers=headers)
            shown = response.json()
            if response.status_code == 201:  # ids, times and nonces differ between the runs
                shown = [*sorted(shown["order"]), shown["order"]["state"], shown["fills"]]
            elif name == "replayed":
                shown = shown["error"]
            headers_shown = {
                k: v for k, v in response.headers.items() if k not in ("content-length", "date")
            }
            mine.append([name, response.status_code, shown, headers_shown])
        answers.append(mine)
    assert answers[0] == answers[1]
    statuses = {name: status for name, status, _, _ in answers[0]}
    assert statuses == {
        "good": 201,
        "replayed": 409,
        "forged": 401,
        "expired": statuses["expired"],
        "extra field": 422,
        "not json": 422,
        "deep": statuses["deep"],
        "wrong type": 415,
        "no type": 415,
        "too large": 413,
    }
    assert 400 <= statuses["expired"] < 500 and 400 <= statuses["deep"] < 500


def test_fast_answer_when_orders_rest_and_fill_then_bytes_equal_the_models_json(
    service: MarketService,
) -> None:
    provider, client = Trader(), Trader()
    bodies = [
        provider.ask(START, price=100, quantity=5),  # rests, with its quote
        client.bid(START, price=100, quantity=2),  # fills against it
        client.bid(START, price=90, quantity=1),  # rests
    ]
    answers = []
    for body in bodies:
        [placed] = asyncio.run(service.placed_async([OrderCreate.model_validate(body)]))
        expected = place_results([placed])[0].model_dump_json().encode()
        assert encode_result(placed) == expected
        answers.append(json.loads(expected))
    assert answers[0]["order"]["quote"]["provider"] == provider.address
    assert [f["quantity"] for f in answers[1]["fills"]] == [2]
    assert answers[2]["order"]["state"] == "open"
