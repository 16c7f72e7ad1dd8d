"""The OpenAPI document holds: schemathesis drives the real market app (real SQLite, a book with
orders and fills in it) and checks every answer against the schema: no 5xx, every status
declared, every body of its declared shape (errors included), content types and headers."""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any

import schemathesis
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, settings
from schemathesis.checks import (
    content_type_conformance,
    not_a_server_error,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from market.api.app import create_app
from market.service import MarketService
from market.settings import Settings

from .signing import CHAIN_ID, ESCROW, Trader

CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
]
_DATA = Path(tempfile.mkdtemp(prefix="market-openapi-"))
SERVICE = MarketService(
    Settings(data_dir=_DATA, chain_id=CHAIN_ID, escrow=ESCROW, run_jobs=False, rate_per_address=0)
)
APP = create_app(service=SERVICE)


def _seed() -> None:
    """Live orders, a fill and a provider, so reads answer with data, not only empty lists."""
    now = int(time.time())
    client, provider = Trader(), Trader()
    with TestClient(APP) as http:
        for body in (
            provider.ask(now, price=100, quantity=5),
            provider.ask(now, price=120, quantity=5, slo_ms=50),
            client.bid(now, price=100, quantity=2),
            client.bid(now, price=90, quantity=2),
        ):
            assert http.post("/v1/orders", json=body).status_code == 201
        assert http.post("/v1/providers/heartbeat", json=provider.heartbeat(now)).status_code == 200


_seed()
schema = schemathesis.openapi.from_asgi("/openapi.json", APP).exclude(path="/v1/stream")


@schema.parametrize()
@settings(
    max_examples=15,
    deadline=None,
    suppress_health_check=list(HealthCheck),
    derandomize=True,
)
def test_api_when_fuzzed_then_every_answer_conforms_to_the_schema(case: Any) -> None:
    case.call_and_validate(checks=CHECKS)


def test_schema_declares_every_error_status_with_the_one_error_shape() -> None:
    document = APP.openapi()
    error = {"$ref": "#/components/schemas/ErrorPublic"}
    operations = [
        (path, method, operation)
        for path, methods in document["paths"].items()
        for method, operation in methods.items()
    ]
    assert len(operations) >= 20
    for path, _method, operation in operations:
        responses = operation["responses"]
        for status in ("413", "429"):
            assert responses[status]["content"]["application/json"]["schema"] == error, path
        assert "Retry-After" in responses["429"]["headers"]
    place = document["paths"]["/v1/orders"]["post"]["responses"]
    assert {"401", "403", "409", "413", "415", "422", "429"} <= set(place)
    assert "404" in document["paths"]["/v1/orders/{order_id}"]["get"]["responses"]
    assert "HTTPValidationError" not in document["components"]["schemas"]
