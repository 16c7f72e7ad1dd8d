"""The market API over both SQL backends: signed orders, matches into deals, auth, limits."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest
from eth_account import Account
from fastapi.testclient import TestClient

from contracts.messages import ZERO_ADDRESS, Plan, Quote
from contracts.pricing import locked_stake
from contracts.typed_data import schema
from market.api.app import create_app
from market.auth import RateLimiter
from market.service import MarketService
from market.settings import Settings

from .conftest import START, Clock
from .signing import ESCROW, GIB, METERED, Trader

NOW = START


def place(client: TestClient, body: dict[str, Any], status: int = 201) -> dict[str, Any]:
    response = client.post("/v1/orders", json=body)
    assert response.status_code == status, response.text
    result: dict[str, Any] = response.json()
    return result


def test_place_when_bid_crosses_ask_then_fill_becomes_deal_for_both(
    client: TestClient, alice: Trader, bob: Trader
) -> None:
    ask = place(client, bob.ask(NOW, price=90, quantity=5))
    assert ask["order"]["state"] == "open" and ask["fills"] == []
    bid = place(client, alice.bid(NOW, price=100, quantity=8))
    assert [(f["price"], f["quantity"]) for f in bid["fills"]] == [(90, 5)]
    assert bid["order"]["state"] == "partially_filled" and bid["order"]["remaining"] == 3
    deal_id = bid["fills"][0]["id"]
    for party in (alice, bob):
        deals = client.get("/v1/deals", params={"party": party.address}).json()
        assert [d["deal_id"] for d in deals] == [deal_id]
    deal = client.get(f"/v1/deals/{deal_id}").json()
    assert deal["client"] == alice.address and deal["provider"] == bob.address
    assert deal["status"] == "matched" and deal["max_spend"] == "450"
    assert deal["bid"]["signature"] == bid["order"]["signature"]
    assert deal["ask"]["order_id"] == ask["order"]["order_id"]
    # The ask's quote states the terms only: the deal waits for the quote of its own fill.
    assert (deal["quote"], deal["quote_signature"], deal["quote_hash"]) == (None, None, None)
    terms = Quote.from_json(deal["ask"]["quote"])
    assert terms.provider == bob.address and terms.client == ZERO_ADDRESS
    assert terms.recover(bob.escrow_domain, bytes.fromhex(deal["ask"]["quote_signature"][2:])) == (
        bob.address
    )
    book = client.get("/v1/book/tpu-v5e").json()
    level = {"price": 100, "quantity": 3, "orders": 1, "plan": "metered", "slo_ms": 100}
    assert book["asks"] == [] and book["bids"] == [{**level, "memory": 16 << 30}]
    assert client.get(f"/v1/orders/{ask['order']['order_id']}").json()["state"] == "filled"


def test_batch_when_valid_then_places_all_in_order(
    client: TestClient, alice: Trader, bob: Trader
) -> None:
    orders = [bob.ask(NOW, price=100 + i) for i in range(5)] + [alice.bid(NOW, price=102)]
    response = client.post("/v1/orders/batch", json={"orders": orders})
    assert response.status_code == 201, response.text
    results = response.json()["results"]
    assert [len(r["fills"]) for r in results] == [0, 0, 0, 0, 0, 1]
    assert results[-1]["fills"][0]["price"] == 100
    assert len(client.get("/v1/orders", params={"owner": bob.address}).json()) == 5


def test_batch_when_one_signature_is_bad_then_rejects_all(
    client: TestClient, alice: Trader, bob: Trader
) -> None:
    good = bob.ask(NOW)
    bad = alice.bid(NOW)
    bad["price"] = 1_000  # the signature covered 100
    response = client.post("/v1/orders/batch", json={"orders": [good, bad]})
    assert response.status_code == 401
    assert "signed by" in response.json()["detail"]
    assert client.get("/v1/orders").json() == []


def test_place_when_signed_by_someone_else_then_401(client: TestClient, alice: Trader) -> None:
    body = alice.bid(NOW)
    body["owner"] = Trader().address
    assert place(client, body, 401)["error"] == "AuthError"


def test_place_when_same_order_replayed_then_409(client: TestClient, alice: Trader) -> None:
    body = alice.bid(NOW)
    place(client, body)
    assert place(client, body, 409)["error"] == "DuplicateOrderError"


def test_place_when_nonce_reused_then_409(client: TestClient, alice: Trader) -> None:
    place(client, alice.bid(NOW, nonce=7))
    assert place(client, alice.bid(NOW, nonce=7, price=99), 409)["error"] == "ReplayError"


def test_place_when_expired_then_401(client: TestClient, alice: Trader) -> None:
    result = place(client, alice.bid(NOW, expiry=NOW), 401)
    assert result["error"] == "SignatureExpiredError" and "expired" in result["detail"]


def test_place_when_ask_quote_plan_differs_then_422(client: TestClient, bob: Trader) -> None:
    result = place(client, bob.ask(NOW, plan="flat"), 422)
    assert "plan" in result["detail"]


def test_place_when_ask_has_no_quote_then_422(client: TestClient, bob: Trader) -> None:
    body = bob.ask(NOW)
    del body["quote"], body["quote_signature"]
    assert place(client, body, 422)["error"] == "InvalidOrderError"


def test_place_when_quote_signed_by_other_then_401(client: TestClient, bob: Trader) -> None:
    body = bob.ask(NOW)
    other = Trader()
    q = Quote.from_json(body["quote"])
    body["quote_signature"] = "0x" + q.sign(other.escrow_domain, other.key).hex()
    assert "quote signed by" in place(client, body, 401)["detail"]


@pytest.mark.parametrize(
    ("field", "value"),
    [("quantity", 0), ("price", -1), ("price", 2**70), ("side", "buy"), ("owner", "0x12")],
)
def test_place_when_field_invalid_then_422(
    client: TestClient, alice: Trader, field: str, value: object
) -> None:
    body = alice.bid(NOW)
    body[field] = value
    assert client.post("/v1/orders", json=body).status_code == 422


def test_cancel_when_owner_signs_then_cancelled_and_replay_rejected(
    client: TestClient, alice: Trader
) -> None:
    order_id = place(client, alice.bid(NOW))["order"]["order_id"]
    cancel = alice.cancel(order_id, NOW)
    response = client.post("/v1/orders/cancel", json=cancel)
    assert response.status_code == 200, response.text
    assert response.json()["state"] == "cancelled"
    assert client.get("/v1/book/tpu-v5e").json()["bids"] == []
    assert client.post("/v1/orders/cancel", json=cancel).status_code == 409


def test_cancel_when_not_owner_then_403(client: TestClient, alice: Trader, bob: Trader) -> None:
    order_id = place(client, alice.bid(NOW))["order"]["order_id"]
    assert client.post("/v1/orders/cancel", json=bob.cancel(order_id, NOW)).status_code == 403


def test_cancel_when_signature_expired_then_401(client: TestClient, alice: Trader) -> None:
    order_id = place(client, alice.bid(NOW))["order"]["order_id"]
    body = alice.cancel(order_id, NOW, expiry=NOW - 1)
    assert client.post("/v1/orders/cancel", json=body).status_code == 401


def test_cancel_when_unknown_order_then_404(client: TestClient, alice: Trader) -> None:
    body = alice.cancel("0x" + "00" * 32, NOW)
    assert client.post("/v1/orders/cancel", json=body).status_code == 404


def test_expire_job_when_orders_pass_expiry_then_stored_as_expired(
    client: TestClient, service: MarketService, clock: Clock, alice: Trader
) -> None:
    short = place(client, alice.bid(NOW, expiry=NOW + 10))["order"]["order_id"]
    long = place(client, alice.bid(NOW, expiry=NOW + 100))["order"]["order_id"]
    clock.advance(10)
    assert service.expire_orders() == 1
    assert client.get(f"/v1/orders/{short}").json()["state"] == "expired"
    assert client.get(f"/v1/orders/{long}").json()["state"] == "open"


def test_rate_limit_when_address_exceeds_then_429(
    client: TestClient, service: MarketService, alice: Trader
) -> None:
    # A clock that stands still: no token comes back however slowly the requests run.
    service.address_limiter = RateLimiter(rate=1.0, burst=3.0, clock=lambda: 0.0)
    for _ in range(3):
        place(client, alice.bid(NOW))
    response = client.post("/v1/orders", json=alice.bid(NOW))
    assert response.status_code == 429 and "Retry-After" in response.headers
    place(client, Trader().bid(NOW))  # others are not limited by alice's bucket


def test_rate_limit_when_ip_exceeds_then_429(client: TestClient, service: MarketService) -> None:
    service.ip_limiter = RateLimiter(rate=1.0, burst=2.0, clock=lambda: 0.0)
    assert [client.get("/v1/classes").status_code for _ in range(3)] == [200, 200, 429]


def test_size_limit_when_body_too_large_then_413(client: TestClient, alice: Trader) -> None:
    body = alice.bid(NOW)
    body["padding"] = "x" * (2 << 20)
    response = client.post("/v1/orders", json=body)
    assert response.status_code == 413 and "larger than" in response.json()["detail"]


def test_batch_when_too_many_orders_then_413(
    client: TestClient, service: MarketService, alice: Trader
) -> None:
    service.settings.max_batch = 3
    response = client.post("/v1/orders/batch", json={"orders": [alice.bid(NOW) for _ in range(4)]})
    assert response.status_code == 413


def test_unknown_records_then_404_and_bad_ids_422(client: TestClient) -> None:
    assert client.get("/v1/orders/0x" + "ab" * 32).status_code == 404
    assert client.get("/v1/deals/tpu-v5e:99").status_code == 404
    assert client.get("/v1/orders/nothex").status_code == 422
    assert client.get("/v1/book/BAD CLASS").status_code == 422


def test_heartbeat_when_signed_then_registered_with_prior_reliability(
    client: TestClient, bob: Trader
) -> None:
    response = client.post("/v1/providers/heartbeat", json=bob.heartbeat(NOW, throughput=7))
    assert response.status_code == 200, response.text
    [provider] = client.get("/v1/providers").json()
    assert provider["address"] == bob.address and provider["online"]
    assert provider["throughput"] == 7 and provider["reliability"] == 0.5


def test_heartbeat_when_replayed_or_stale_then_409(client: TestClient, bob: Trader) -> None:
    body = bob.heartbeat(NOW)
    assert client.post("/v1/providers/heartbeat", json=body).status_code == 200
    assert client.post("/v1/providers/heartbeat", json=body).status_code == 409
    older = bob.heartbeat(NOW - 5)
    assert client.post("/v1/providers/heartbeat", json=older).status_code == 409


def test_heartbeat_when_advert_altered_then_401(client: TestClient, bob: Trader) -> None:
    body = bob.heartbeat(NOW)
    body["advert"]["throughput"] = 1e6
    assert client.post("/v1/providers/heartbeat", json=body).status_code == 401


def test_heartbeat_when_clock_skewed_then_401(client: TestClient, bob: Trader) -> None:
    body = bob.heartbeat(NOW - 3_600)
    assert client.post("/v1/providers/heartbeat", json=body).status_code == 401


def test_offline_job_when_provider_silent_then_marked_offline(
    client: TestClient, service: MarketService, clock: Clock, bob: Trader
) -> None:
    client.post("/v1/providers/heartbeat", json=bob.heartbeat(NOW))
    clock.advance(service.settings.provider_offline_after_s + 1)
    assert service.mark_offline() == 1
    assert client.get("/v1/providers").json()[0]["online"] is False
    client.post("/v1/providers/heartbeat", json=bob.heartbeat(int(clock.now)))
    assert client.get("/v1/providers").json()[0]["online"] is True


def test_metrics_and_docs_are_served(client: TestClient, alice: Trader) -> None:
    place(client, alice.bid(NOW))
    metrics = client.get("/metrics").text
    assert 'market_orders_accepted_total{device_class="tpu-v5e",side="bid"} 1.0' in metrics
    assert "market_commit_group_orders_count 1.0" in metrics  # one group commit, one order
    assert 'market_commit_group_orders_bucket{le="1.0"} 1.0' in metrics
    assert client.get("/docs").status_code == 200
    assert "/v1/orders/batch" in client.get("/openapi.json").json()["paths"]


def test_openapi_when_placement_routes_parse_raw_bodies_then_body_schemas_still_published(
    client: TestClient,
) -> None:
    document = client.get("/openapi.json").json()
    for path, model in (("/v1/orders", "OrderCreate"), ("/v1/orders/batch", "OrderBatch")):
        body = document["paths"][path]["post"]["requestBody"]["content"]["application/json"]
        assert body["schema"] == {"$ref": f"#/components/schemas/{model}"}
    schemas = document["components"]["schemas"]
    assert schemas["OrderBatch"]["properties"]["orders"]["items"] == {
        "$ref": "#/components/schemas/OrderCreate"
    }
    assert schemas["OrderCreate"]["properties"]["signature"]["pattern"]
    assert "QuoteIn" in schemas and "PlanIn" in schemas


def test_place_when_body_is_not_json_then_422_naming_the_problem(client: TestClient) -> None:
    response = client.post(
        "/v1/orders/batch", content=b"{not json", headers={"content-type": "application/json"}
    )
    assert response.status_code == 422
    assert response.json()["problems"][0]["type"] == "json_invalid"
    response = client.post(
        "/v1/orders", content=b"\x80\xff", headers={"content-type": "application/json"}
    )
    assert response.status_code == 422
    response = client.post("/v1/orders/batch", json={"orders": []})
    assert response.status_code == 422
    assert response.json()["problems"][0]["loc"] == ["body", "orders"]


def test_history_and_fills_when_trades_then_bars(
    client: TestClient, clock: Clock, alice: Trader, bob: Trader
) -> None:
    place(client, bob.ask(NOW, price=90, quantity=2))
    place(client, alice.bid(NOW, price=95, quantity=1))
    clock.advance(120)
    place(client, alice.bid(int(clock.now), price=95, quantity=1))
    bars = client.get("/v1/history/tpu-v5e", params={"bucket_s": 60}).json()
    assert [bar[1:] for bar in bars] == [[90, 90, 90, 90, 1], [90, 90, 90, 90, 1]]
    assert len(client.get("/v1/fills").json()) == 2


def _matched(client: TestClient, alice: Trader, bob: Trader) -> tuple[str, Quote]:
    """Match bob's ask (10 units at 100) with alice's bid for 4; return the deal and the terms."""
    ask = place(client, bob.ask(NOW, price=100, quantity=10))
    deal_id = place(client, alice.bid(NOW, price=100, quantity=4))["fills"][0]["id"]
    return deal_id, Quote.from_json(ask["order"]["quote"])


def _attach(client: TestClient, deal_id: str, body: dict[str, Any], status: int) -> dict[str, Any]:
    response = client.post(f"/v1/deals/{deal_id}/quote", json=body)
    assert response.status_code == status, response.text
    result: dict[str, Any] = response.json()
    return result


def test_attach_quote_when_provider_signs_quote_for_the_fill_then_deal_carries_it(
    client: TestClient, alice: Trader, bob: Trader
) -> None:
    deal_id, terms = _matched(client, alice, bob)
    fill = bob.fill_quote(terms, client=alice.address, max_spend=400, valid_until=NOW + 600)
    deal = _attach(client, deal_id, bob.signed(fill), 200)
    assert deal["quote_hash"] == "0x" + fill.struct_hash().hex()
    assert Quote.from_json(deal["quote"]) == fill and fill.client == alice.address
    assert Quote.from_json(deal["ask"]["quote"]) == terms  # the ask's terms, shown apart
    assert client.get(f"/v1/deals/{deal_id}").json() == deal
    assert _attach(client, deal_id, bob.signed(fill), 200) == deal  # the same again: idempotent


def test_attach_quote_holding_the_fill_s_share_of_the_ask_s_stake_then_accepted(
    client: TestClient, alice: Trader, bob: Trader
) -> None:
    """A fill of 400 out of an ask of 1e9 holds ceil(stake * 400 / 1e9) of the ask's stake:
    locking a provider's stake costs the bidder in proportion to what it bought."""
    deal_id, terms = _matched(client, alice, bob)
    share = locked_stake(terms.stake, terms.max_spend, 400)
    assert 0 < share < terms.stake
    fill = bob.fill_quote(
        terms, client=alice.address, max_spend=400, valid_until=NOW + 600, stake=share
    )
    assert Quote.from_json(_attach(client, deal_id, bob.signed(fill), 200)["quote"]).stake == share


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"client": ZERO_ADDRESS}, "client"),
        ({"client": "0x" + "c1" * 20}, "client"),
        ({"stake": 0}, "stake"),  # below the fill's share of the ask's stake
        ({"penalty": 1}, "penalty"),
        ({"challenge_window": 61}, "challenge_window"),
        ({"arbiter": "0x" + "a2" * 20}, "arbiter"),
        ({"duration": 60}, "duration"),
        ({"slo_ms": 500}, "slo_ms"),
        ({"plan": Plan(price_per_device_ms=1, compile_price=1_000, inference_price=500)}, "plan"),
        ({"max_spend": 399}, "max_spend"),
    ],
)
def test_attach_quote_when_it_names_another_client_or_changes_a_term_then_422(
    client: TestClient, alice: Trader, bob: Trader, change: dict[str, Any], field: str
) -> None:
    deal_id, terms = _matched(client, alice, bob)
    fields: dict[str, Any] = {"client": alice.address, "max_spend": 400, **change}
    fill = bob.fill_quote(terms, valid_until=NOW + 600, **fields)
    assert f"quote.{field}" in _attach(client, deal_id, bob.signed(fill), 422)["detail"]
    assert client.get(f"/v1/deals/{deal_id}").json()["quote"] is None


def test_attach_quote_when_not_signed_by_the_deals_provider_or_expired_then_refused(
    client: TestClient, alice: Trader, bob: Trader, clock: Clock
) -> None:
    deal_id, terms = _matched(client, alice, bob)
    mallory = Trader()
    foreign = mallory.fill_quote(
        terms, client=alice.address, max_spend=400, valid_until=NOW + 600, provider=mallory.address
    )
    assert _attach(client, deal_id, mallory.signed(foreign), 403)["error"] == "ForbiddenError"
    forged = bob.fill_quote(terms, client=alice.address, max_spend=400, valid_until=NOW + 600)
    forged_body = {
        **bob.signed(forged),
        "quote_signature": mallory.signed(forged)["quote_signature"],
    }
    assert "quote signed by" in _attach(client, deal_id, forged_body, 401)["detail"]
    stale = bob.fill_quote(terms, client=alice.address, max_spend=400, valid_until=NOW)
    assert _attach(client, deal_id, bob.signed(stale), 401)["error"] == "SignatureExpiredError"


def test_attach_quote_when_deal_has_a_live_quote_then_409_until_it_expires_unused(
    client: TestClient, alice: Trader, bob: Trader, clock: Clock
) -> None:
    deal_id, terms = _matched(client, alice, bob)
    first = bob.fill_quote(terms, client=alice.address, max_spend=400, valid_until=NOW + 60)
    _attach(client, deal_id, bob.signed(first), 200)
    second = bob.fill_quote(terms, client=alice.address, max_spend=400, valid_until=NOW + 600)
    assert "one quote per deal" in _attach(client, deal_id, bob.signed(second), 409)["detail"]
    clock.advance(60)  # the first expired unopened: the provider may sign another
    deal = _attach(client, deal_id, bob.signed(second), 200)
    assert deal["quote_hash"] == "0x" + second.struct_hash().hex()


def test_attach_quote_when_attacker_replays_an_old_or_cheaper_quote_of_the_provider_then_refused(
    client: TestClient, alice: Trader, bob: Trader
) -> None:
    """Bob signed quotes before: his ask's (no client), one for alice's other fill, and one
    for alice at cheaper terms under an older ask. Anyone can post them; none fits this deal."""
    old_ask = bob.quote(slo_ms=100, valid_until=NOW + 3_600, penalty=1, stake=0)
    cheaper = bob.fill_quote(old_ask, client=alice.address, max_spend=400, valid_until=NOW + 600)
    deal_id, terms = _matched(client, alice, bob)
    other_deal = place(client, alice.bid(NOW, price=100, quantity=4))["fills"][0]["id"]
    other = bob.fill_quote(terms, client=alice.address, max_spend=400, valid_until=NOW + 600)
    _attach(client, other_deal, bob.signed(other), 200)

    assert "quote.client" in _attach(client, deal_id, bob.signed(terms), 422)["detail"]
    assert "quote.stake" in _attach(client, deal_id, bob.signed(cheaper), 422)["detail"]
    taken = _attach(client, deal_id, bob.signed(other), 409)["detail"]
    assert f"belongs to deal {other_deal}" in taken
    assert client.get(f"/v1/deals/{deal_id}").json()["quote"] is None
    mine = bob.fill_quote(terms, client=alice.address, max_spend=400, valid_until=NOW + 600)
    assert _attach(client, deal_id, bob.signed(mine), 200)["quote"] == mine.to_json()


def test_place_when_ask_quote_has_no_challenge_window_then_422(
    client: TestClient, bob: Trader
) -> None:
    quote = bob.quote(slo_ms=100, valid_until=NOW + 3_600, challenge_window=0)
    refused = place(client, bob.ask(NOW, quote=quote), 422)
    assert refused["error"] == "ChallengeWindowTooShortError"
    assert "minimum challenge window of 1s" in refused["detail"]


def test_place_when_ask_window_below_the_markets_minimum_then_422(
    settings: Settings, clock: Clock, bob: Trader
) -> None:
    strict = settings.model_copy(update={"min_challenge_window": 30})
    service = MarketService(strict, clock=clock)
    try:
        with TestClient(create_app(service=service)) as api:
            short = bob.quote(slo_ms=100, valid_until=NOW + 3_600, challenge_window=29)
            refused = place(api, bob.ask(NOW, quote=short), 422)
            assert "minimum challenge window of 30s" in refused["detail"]
            enough = bob.quote(slo_ms=100, valid_until=NOW + 3_600, challenge_window=30)
            place(api, bob.ask(NOW, quote=enough))
    finally:
        service.close()


def test_typed_data_when_a_wallet_signs_the_served_schema_then_signature_equals_ours(
    client: TestClient, service: MarketService, bob: Trader
) -> None:
    served = client.get("/v1/typed-data").json()
    assert served == json.loads(json.dumps(schema(service.escrow_domain)))
    assert served["domain"]["version"] == "2"
    assert served["domain"]["verifyingContract"].lower() == ESCROW
    quote = bob.quote(slo_ms=100, valid_until=NOW + 600, client=bob.address)
    message = {
        "types": {name: served["types"][name] for name in ("EIP712Domain", "Quote", "Plan")},
        "primaryType": "Quote",
        "domain": served["domain"],
        "message": quote.as_typed_data(),
    }
    wallet = Account.sign_typed_data(bob.key, full_message=message)
    assert bytes(wallet.signature) == quote.sign(bob.escrow_domain, bob.key)


# -- the book as a buyer reads it, offers, the tape -----------------------------------------------

FLAT = Plan(inference_price=500)


def _compatible(bid: dict[str, Any], ask: dict[str, Any]) -> bool:
    return bool(
        bid["plan"] == ask["plan"]
        and ask["slo_ms"] <= bid["slo_ms"]
        and ask["memory"] >= bid["memory"]
    )


def test_book_after_random_load_then_no_compatible_pair_of_levels_crosses(
    client: TestClient, clock: Clock
) -> None:
    """Random orders of two plans, three SLOs and three memories, prices overlapping: every
    displayed bid level below every compatible ask level, each buyer's view tradable, and the
    levels hold exactly the live orders."""
    rng = random.Random(12)
    traders = [Trader() for _ in range(6)]
    for _ in range(240):
        trader = rng.choice(traders)
        terms: dict[str, Any] = {
            "slo_ms": rng.choice([50, 100, 200]),
            "memory": rng.choice([8, 16, 32]) * GIB,
            "price": rng.randint(90, 110),
            "quantity": rng.randint(1, 9),
            "plan": rng.choice(["flat", "metered"]),
        }
        if rng.random() < 0.5:
            place(client, trader.bid(int(clock.now), **terms))
        else:
            quote_plan = FLAT if terms["plan"] == "flat" else METERED
            place(client, trader.ask(int(clock.now), quote_plan=quote_plan, **terms))
    book = client.get("/v1/book/tpu-v5e", params={"levels": 500}).json()
    assert book["bids"] and book["asks"]
    pairs = [(b, a) for b in book["bids"] for a in book["asks"] if _compatible(b, a)]
    assert pairs and all(b["price"] < a["price"] for b, a in pairs)
    # Mixed terms: the best prices of incompatible levels may "cross"; no spread is claimed.
    assert not book["tradable"] and book["spread"] is None
    live = client.get("/v1/orders", params={"live": "true", "limit": 500}).json()
    for side, levels in (("bid", book["bids"]), ("ask", book["asks"])):
        orders = [o for o in live if o["side"] == side]
        assert sum(level["quantity"] for level in levels) == sum(o["remaining"] for o in orders)
        assert sum(level["orders"] for level in levels) == len(orders)
    choices = book["choices"]
    assert choices["plans"] == ["flat", "metered"] and choices["slo_ms"] == [50, 100, 200]
    seen_spread = False
    for plan in choices["plans"]:
        for slo_ms in choices["slo_ms"]:
            for memory in choices["memory"]:
                view = client.get(
                    "/v1/book/tpu-v5e",
                    params={"plan": plan, "slo_ms": slo_ms, "memory": memory, "levels": 500},
                ).json()
                assert view["tradable"]
                assert all(_compatible(b, a) for b in view["bids"] for a in view["asks"])
                if view["bids"] and view["asks"]:
                    assert view["best_bid"] < view["best_ask"]
                    assert view["spread"] == view["best_ask"] - view["best_bid"]
                    seen_spread = True
    assert seen_spread


def test_book_when_order_expired_but_not_yet_swept_then_not_shown(
    client: TestClient, clock: Clock, alice: Trader
) -> None:
    place(client, alice.bid(NOW, price=90, expiry=NOW + 5))
    assert client.get("/v1/book/tpu-v5e").json()["bids"][0]["price"] == 90
    clock.advance(5)
    assert client.get("/v1/book/tpu-v5e").json()["bids"] == []


def test_fills_when_trades_alternate_classes_within_a_second_then_newest_first(
    client: TestClient, alice: Trader, bob: Trader
) -> None:
    """Same whole second everywhere (the clock stands still), per-class fill ids that collide:
    the order of commit decides, in `/v1/fills` and in the overview."""
    placed: list[str] = []
    for device_class in ("cpu", "tpu-v5e", "tpu-v5e", "cpu", "gpu-h100", "cpu"):
        place(client, bob.ask(NOW, device_class=device_class, price=50, quantity=1))
        fill = place(client, alice.bid(NOW, device_class=device_class, price=50, quantity=1))
        placed.append(fill["fills"][0]["id"])
    newest_first = placed[::-1]
    assert [f["id"] for f in client.get("/v1/fills").json()] == newest_first
    assert [f["id"] for f in client.get("/v1/overview").json()["fills"]] == newest_first
    cpu = client.get("/v1/fills", params={"device_class": "cpu"}).json()
    assert [f["id"] for f in cpu] == ["cpu:3", "cpu:2", "cpu:1"]


def test_stats_when_trades_over_two_days_then_last_price_change_and_volume(
    client: TestClient, clock: Clock, alice: Trader, bob: Trader
) -> None:
    assert client.get("/v1/stats/tpu-v5e").json()["last_price"] is None
    place(client, bob.ask(NOW, price=80, quantity=1, expiry=NOW + 3 * 86_400))
    place(client, alice.bid(NOW, price=80, quantity=1))
    clock.advance(86_400 + 60)
    now = int(clock.now)
    for price, quantity in ((90, 2), (120, 3), (100, 4)):
        place(client, bob.ask(now, price=price, quantity=quantity))
        place(client, alice.bid(now, price=price, quantity=quantity))
    stats = client.get("/v1/stats/tpu-v5e").json()
    assert stats == {
        "device_class": "tpu-v5e",
        "last_price": 100,
        "last_time": now,
        "change_24h": 20,  # from 80, the last price before the window
        "change_24h_pct": 25.0,
        "high_24h": 120,
        "low_24h": 90,
        "volume_24h": 9,
        "trades_24h": 3,
    }
    assert client.get("/v1/overview").json()["stats"]["tpu-v5e"] == stats


def test_offers_when_providers_ask_then_listed_with_reputation_and_a_command_that_takes_them(
    client: TestClient, alice: Trader
) -> None:
    fast, cheap = Trader(), Trader()
    for provider, kind in ((fast, "TPU v5 lite"), (cheap, "TPU v5 lite (spot)")):
        response = client.post(
            "/v1/providers/heartbeat", json=provider.heartbeat(NOW, device_kind=kind)
        )
        assert response.status_code == 200, response.text
    place(client, fast.ask(NOW, price=120, quantity=4, slo_ms=50, memory=32 * GIB))
    place(client, fast.ask(NOW, price=120, quantity=2, slo_ms=50, memory=32 * GIB))
    place(client, cheap.ask(NOW, price=1_500_000, quantity=7, slo_ms=400, memory=8 * GIB))
    offers = client.get("/v1/offers").json()
    assert [(o["provider"], o["price"], o["quantity"], o["orders"]) for o in offers] == [
        (fast.address, 120, 6, 2),
        (cheap.address, 1_500_000, 7, 1),
    ]
    first = offers[0]
    assert first["device_kind"] == "TPU v5 lite" and first["online"]
    assert first["reliability"] == 0.5 and first["capacity"] == 1_000
    assert offers[1]["command"] == (
        "tpumarket client bid --device-class tpu-v5e --plan metered --slo-ms 400 "
        f"--memory {8 * GIB} --price 1.5 --quantity 7"
    )

    def listed(**params: Any) -> list[str]:
        return [o["provider"] for o in client.get("/v1/offers", params=params).json()]

    assert listed(sort="-price") == [cheap.address, fast.address]
    assert listed(sort="slo_ms") == [fast.address, cheap.address]
    assert listed(max_slo_ms=100) == [fast.address]
    assert listed(min_memory=16 * GIB) == [fast.address]
    assert listed(max_price=1_000) == [fast.address]
    assert listed(plan="flat") == []
    assert listed(device_class="cpu") == []
    assert client.get("/v1/offers", params={"sort": "owner"}).status_code == 422
    # The command, as the client's own CLI parses it, is a bid that takes the offer.
    from client.cli import build_parser

    args = build_parser().parse_args(offers[0]["command"].split()[1:])
    bid = place(
        client,
        alice.bid(
            NOW,
            device_class=args.device_class,
            plan=args.plan,
            slo_ms=args.slo_ms,
            memory=args.memory,
            price=args.price,
            quantity=args.quantity,
        ),
    )
    assert [(f["price"], f["quantity"]) for f in bid["fills"]] == [(120, 4), (120, 2)]
    assert listed() == [cheap.address]


def test_errors_when_any_route_fails_then_one_shape(client: TestClient) -> None:
    answers = {
        404: client.get("/v1/nowhere"),
        405: client.delete("/v1/classes"),
        422: client.get("/v1/book/BAD CLASS"),
    }
    for status, response in answers.items():
        assert response.status_code == status
        body = response.json()
        assert set(body) == {"error", "detail", "problems"} and isinstance(body["detail"], str)
    invalid = answers[422].json()
    assert invalid["error"] == "RequestValidationError"
    assert invalid["detail"].startswith("path.device_class: String should match pattern")
    assert invalid["problems"][0]["loc"] == ["path", "device_class"]
    assert answers[405].headers["allow"] == "GET"


def test_methods_when_a_path_is_served_by_post_only_then_405_names_every_method(
    client: TestClient,
) -> None:
    """``GET /v1/orders/batch`` fell through to ``/v1/orders/{order_id}`` (422), and a 405 or an
    OPTIONS on ``/v1/orders`` named POST alone though GET is served there too."""
    for path in ("/v1/orders/batch", "/v1/orders/cancel"):
        response = client.get(path)
        assert response.status_code == 405, path
        assert response.headers["allow"] == "POST"
        assert response.json()["error"] == "MethodNotAllowedError"
    options = client.options("/v1/orders")
    assert options.status_code == 204
    assert options.headers["allow"] == "GET, POST, OPTIONS"
    assert client.put("/v1/orders").headers["allow"] == "GET, POST"
    assert client.options("/v1/nowhere").status_code == 404
    malformed = client.get("/v1/orders/batches")  # any other segment is still an order id
    assert malformed.status_code == 422
    assert malformed.json()["problems"][0]["loc"] == ["path", "order_id"]


def test_rate_limit_when_ip_bucket_just_short_then_429_says_a_real_wait(
    client: TestClient, service: MarketService
) -> None:
    """A bucket a hair short of a token used to answer "retry after 0.00s"."""
    times = iter([0.0, 0.000_9])  # the second request 0.9 ms later: 0.9 of a token back
    service.ip_limiter = RateLimiter(rate=1_000.0, burst=1.0, clock=lambda: next(times))
    assert client.get("/v1/classes").status_code == 200
    response = client.get("/v1/classes")
    assert response.status_code == 429
    assert response.headers["retry-after"] == "1"
    assert response.json() == {
        "error": "RateLimitedError",
        "detail": "rate limit exceeded for testclient; retry after 1 s",
        "problems": [],
    }


def test_fills_of_a_database_made_before_seq_when_restarted_then_numbered_oldest_first(
    settings: Settings, clock: Clock, alice: Trader, bob: Trader
) -> None:
    first = MarketService(settings, clock=clock)
    with TestClient(create_app(service=first)) as client:
        for device_class in ("tpu-v5e", "cpu", "tpu-v5e"):
            place(client, bob.ask(NOW, device_class=device_class, price=50, quantity=1))
            place(client, alice.bid(NOW, device_class=device_class, price=50, quantity=1))
            clock.advance(1)
    first.close()
    with first.db.begin() as connection:  # the fills table as migration 0001 left it
        for index in ("ix_fills_seq", "ix_fills_class_seq"):
            connection.exec_driver_sql(f"DROP INDEX {index}")
        connection.exec_driver_sql("ALTER TABLE fills DROP COLUMN seq")
        connection.exec_driver_sql("UPDATE alembic_version SET version_num = '0001'")
    second = MarketService(settings, clock=clock)
    with TestClient(create_app(service=second)) as client:
        assert [f["id"] for f in client.get("/v1/fills").json()] == [
            "tpu-v5e:2",
            "cpu:1",
            "tpu-v5e:1",
        ]
        place(client, bob.ask(NOW, device_class="cpu", price=50, quantity=1))
        place(client, alice.bid(NOW, device_class="cpu", price=50, quantity=1))
        assert client.get("/v1/fills").json()[0]["id"] == "cpu:2"
    second.close()
