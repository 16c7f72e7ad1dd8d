"""What a provider advertises is refused (422 naming the field) unless it is safe to show, and
a row stored before the rules is served by them (`market.advert_text`)."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlmodel import Session

from market.models import Provider
from market.service import MarketService

from .conftest import Clock
from .signing import Trader

HOSTILE: list[tuple[str, str, str]] = [
    ("device_kind", "TPU\x07 v5", "a control character (U+0007) at position 3"),
    ("device_kind", "TPU\nv5", "a control character (U+000A) at position 3"),
    ("device_kind", "<script>alert(1)</script>", "markup ('<')"),
    ("device_kind", "TPU \u202ev5", "an invisible formatting character (U+202E)"),
    ("device_kind", "\u2028", "a line separator (U+2028)"),
    ("device_kind", "   ", "nothing but spaces"),
    ("endpoint", "javascript:alert(document.cookie)", "scheme 'javascript'"),
    ("endpoint", "data:text/html,<b>x</b>", "U+003C at position 15: not in a URL"),
    ("endpoint", "data:text/plain,x", "scheme 'data'"),
    ("endpoint", "file:///etc/passwd", "scheme 'file'"),
    ("endpoint", "http://user:secret@provider.example", "a user name or password"),
    ("endpoint", "https://provider.example/\x00", "U+0000 at position 25: not in a URL"),
    ("endpoint", "http:// provider.example", "U+0020 at position 7: not in a URL"),
    ("endpoint", "https://", "no host"),
]


def heartbeat(client: TestClient, trader: Trader, now: float, **advert: Any) -> Any:
    return client.post("/v1/providers/heartbeat", json=trader.heartbeat(int(now), **advert))


@pytest.mark.parametrize(("field", "value", "why"), HOSTILE)
def test_heartbeat_when_an_advertised_field_is_hostile_then_422_names_it_and_nothing_stored(
    client: TestClient, clock: Clock, field: str, value: str, why: str
) -> None:
    response = heartbeat(client, Trader(), clock.now, **{field: value})
    assert response.status_code == 422
    body = response.json()
    assert body["detail"].startswith(f"body.advert.{field}: Value error, ")
    assert why in body["detail"]
    assert body["problems"][0]["loc"] == ["body", "advert", field]
    assert client.get("/v1/providers").json() == []


def test_heartbeat_when_free_text_has_odd_spacing_then_stored_normalized_and_urls_kept(
    client: TestClient, clock: Clock
) -> None:
    trader = Trader()
    url = "HTTPS://provider.example:8443/v1?x=1"
    response = heartbeat(client, trader, clock.now, device_kind="  TPU   v5\u00e9 ", endpoint=url)
    assert response.status_code == 200, response.text
    [shown] = client.get("/v1/providers").json()
    assert (shown["device_kind"], shown["endpoint"]) == ("TPU v5\u00e9", url)
    assert shown["has_history"] is False  # nothing settled on chain: the page says "new"


def test_provider_when_stored_before_the_rules_then_served_by_them(
    client: TestClient, service: MarketService, clock: Clock
) -> None:
    trader = Trader()
    assert heartbeat(client, trader, clock.now).status_code == 200
    with Session(service.db) as session:
        row = session.get(Provider, trader.address)
        assert row is not None
        row.device_kind = "<img src=x>\x1b[31m"
        row.endpoint = "javascript:alert(1)"
        session.add(row)
        session.commit()
    [shown] = client.get("/v1/providers").json()
    assert shown["endpoint"] == ""
    assert shown["device_kind"] == "\ufffdimg src=x\ufffd\ufffd[31m"
