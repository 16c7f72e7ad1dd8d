"""A refused batch costs the market only what its refusal needs.

Signature recovery is the cost that counts (~80 µs an order); these tests count recoveries
(the market's own `market.verify.recover_addresses`, wrapped) and check that a batch is refused
on what needs none before any is made, that recovery stops at the end of the chunk holding
the first bad signature (`RECOVER_CHUNK` orders recovered in one library call), that a
body's validation stops at its first invalid order, and that the caller's IP bucket pays one
token per order before any recovery. `scripts/bench_invalid_batches.py` measures the CPU.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from contracts.signing import recover_addresses
from market import verify
from market.auth import RateLimiter
from market.service import MarketService

from .conftest import START
from .signing import Trader

NOW = START
COUNT = 40


@pytest.fixture
def recoveries(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """Count the signatures the market recovers."""
    counted = [0]
    real: Callable[..., Any] = recover_addresses  # what `market.verify` calls

    def counting(pairs: list[Any]) -> Any:
        counted[0] += len(pairs)
        return real(pairs)

    monkeypatch.setattr(verify, "recover_addresses", counting)
    yield counted


def bids(count: int, **overrides: Any) -> list[dict[str, Any]]:
    trader = Trader()
    return [trader.bid(NOW, **overrides) for _ in range(count)]


def post(client: TestClient, orders: list[dict[str, Any]]) -> Any:
    return client.post("/v1/orders/batch", json={"orders": orders})


def test_batch_when_its_last_order_expired_then_401_before_any_recovery(
    client: TestClient, recoveries: list[int]
) -> None:
    expired = Trader().bid(NOW, expiry=NOW - 1)
    response = post(client, [*bids(COUNT - 1), expired])
    assert response.status_code == 401
    assert response.json()["detail"] == f"order expired at {NOW - 1} (now {NOW})"
    assert recoveries[0] == 0


def test_batch_when_its_last_order_is_too_far_ahead_then_422_before_any_recovery(
    client: TestClient, service: MarketService, recoveries: list[int]
) -> None:
    far = NOW + service.settings.max_order_ttl_s + 1
    response = post(client, [*bids(COUNT - 1), Trader().bid(NOW, expiry=far)])
    assert response.status_code == 422
    assert response.json()["error"] == "InvalidOrderError"
    assert recoveries[0] == 0


def test_batch_when_its_last_order_reuses_a_nonce_then_409_before_any_recovery(
    client: TestClient, recoveries: list[int]
) -> None:
    trader = Trader()
    orders = [trader.bid(NOW) for _ in range(COUNT - 1)]
    response = post(client, [*orders, trader.bid(NOW, nonce=1)])
    assert response.status_code == 409
    assert response.json()["detail"] == f"nonce 1 of {trader.address} appears twice in batch"
    assert recoveries[0] == 0


def test_batch_when_one_signature_is_wrong_then_recovery_stops_there(
    client: TestClient, recoveries: list[int]
) -> None:
    orders = bids(COUNT)
    forged = Trader().bid(NOW, nonce=10**9)
    forged["owner"] = orders[0]["owner"]
    orders[9] = forged
    response = post(client, orders)
    assert response.status_code == 401
    # Its chunk's (the nine before it, its own and six after); none of the twenty-four after
    assert verify.RECOVER_CHUNK == 16
    assert recoveries[0] == 16
    assert client.get("/v1/orders", params={"owner": orders[0]["owner"]}).json() == []


def test_batch_when_every_order_is_invalid_then_only_the_first_is_validated(
    client: TestClient, recoveries: list[int]
) -> None:
    """500 `{"side": "bid"}` used to be validated whole: 5,000 problems built, 10 shown."""
    response = post(client, [{"side": "bid"}] * 500)
    assert response.status_code == 422
    problems = response.json()["problems"]
    assert problems and all(p["loc"][:3] == ["body", "orders", 0] for p in problems)
    assert all(p["type"] != "too_many_errors" for p in problems)
    assert recoveries[0] == 0


def test_batch_when_its_ip_bucket_lacks_a_token_per_order_then_429_before_any_recovery(
    client: TestClient, service: MarketService, recoveries: list[int]
) -> None:
    service.ip_limiter = RateLimiter(rate=1e-6, burst=COUNT + 5)
    first = post(client, bids(COUNT))
    assert first.status_code == 201  # COUNT tokens: the request's own and COUNT - 1 more
    assert recoveries[0] == COUNT
    second = post(client, bids(COUNT))
    assert second.status_code == 429
    assert recoveries[0] == COUNT
