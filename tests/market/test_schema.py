"""Property-based run over the OpenAPI schema (schemathesis): no input makes the API fail 5xx."""

from __future__ import annotations

import tempfile
from pathlib import Path

import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error

from market.api.app import create_app
from market.service import MarketService, Settings

from .signing import CHAIN_ID, ESCROW

_DATA = Path(tempfile.mkdtemp(prefix="market-schema-"))
SERVICE = MarketService(
    Settings(
        data_dir=_DATA,
        chain_id=CHAIN_ID,
        escrow=ESCROW,
        run_jobs=False,
        rate_per_ip=0,
        rate_per_address=0,
    )
)
APP = create_app(service=SERVICE)
schema = schemathesis.openapi.from_asgi("/openapi.json", APP).exclude(path="/v1/stream")


@schema.parametrize()
@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=list(HealthCheck),
    derandomize=True,
)
def test_api_when_fuzzed_then_never_5xx(case: schemathesis.Case) -> None:  # type: ignore[type-arg]
    case.call_and_validate(checks=[not_a_server_error])
