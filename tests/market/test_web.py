"""The web order book in real headless Chromium (Debian's, driven by Playwright)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlmodel import Session

from market.models import ChainDeal, Deal, ProviderClient
from market.storage import database_url, make_engine

from .server import ROOT, market_server
from .signing import Trader

CHROMIUM = Path("/usr/bin/chromium")
ARTIFACTS = ROOT / "artifacts"

pytestmark = pytest.mark.skipif(not CHROMIUM.exists(), reason="Debian's chromium is not installed")


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("web") / "data"


@pytest.fixture(scope="module")
def server(data_dir: Path) -> Iterator[str]:
    with market_server(data_dir) as url:
        yield url


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    profile = tmp_path_factory.mktemp("chromium-profile")
    with sync_playwright() as p:
        context = p.chromium.launch_persistent_context(
            str(profile),
            executable_path=str(CHROMIUM),
            headless=True,
            args=[
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-background-networking",
                "--disable-component-update",
                "--no-first-run",
            ],
            viewport={"width": 1400, "height": 1100},
        )
        yield context
        context.close()


def _post(url: str, path: str, body: dict[str, Any]) -> dict[str, Any]:
    response = httpx.post(url + path, json=body, timeout=10)
    assert response.status_code in (200, 201), response.text
    result: dict[str, Any] = response.json()
    return result


def _seed(url: str) -> tuple[Trader, Trader]:
    client, provider = Trader(), Trader()
    now = int(time.time())
    orders = [provider.ask(now, price=100 + i, quantity=5 + i) for i in range(4)]
    orders += [client.bid(now, price=95 - i, quantity=3 + i) for i in range(4)]
    _post(url, "/v1/orders/batch", {"orders": orders})
    _post(url, "/v1/orders", client.bid(now, price=101, quantity=7))  # trades 5 @100, 2 @101
    _post(url, "/v1/providers/heartbeat", provider.heartbeat(now))
    return client, provider


def test_page_when_loaded_then_shows_seeded_book_without_console_errors(
    server: str, browser: Any
) -> None:
    _seed(server)
    page = browser.new_page()
    errors: list[str] = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(server + "/")
    page.wait_for_selector("[data-testid=asks] tbody tr")
    asks = page.locator("[data-testid=asks] tbody tr").all_inner_texts()
    assert asks[0].split() == ["101", "4", "1"]  # 6 - 2 left at 101
    assert page.locator("[data-testid=bids] tbody tr").count() == 4
    assert page.locator("[data-testid=fills] tbody tr").count() == 2
    assert page.locator("[data-testid=deals] tbody tr").count() == 2
    assert "matched" in page.locator("[data-testid=deals]").inner_text()
    assert "TPU v5 lite" in page.locator("[data-testid=providers]").inner_text()
    page.wait_for_selector("[data-testid=live].on")
    assert errors == []
    page.close()


def test_page_when_order_placed_through_api_then_appears_without_reload(
    server: str, browser: Any
) -> None:
    page = browser.new_page()
    page.goto(server + "/")
    page.wait_for_selector("[data-testid=live].on")
    navigations: list[str] = []
    page.on("framenavigated", lambda frame: navigations.append(frame.url))
    now = int(time.time())
    _post(server, "/v1/orders", Trader().bid(now, price=77, quantity=42))
    page.wait_for_function(
        "() => [...document.querySelectorAll('[data-testid=bids] tbody tr')]"
        ".some(r => r.innerText.includes('42') && r.innerText.includes('77'))",
        timeout=10_000,
    )
    assert navigations == []
    page.close()


def test_screenshot_of_live_book_is_written(server: str, browser: Any) -> None:
    page = browser.new_page()
    page.goto(server + "/")
    page.wait_for_selector("[data-testid=asks] tbody tr")
    page.wait_for_selector("[data-testid=live].on")
    ARTIFACTS.mkdir(exist_ok=True)
    target = ARTIFACTS / "market-order-book.png"
    page.screenshot(path=str(target), full_page=True)
    assert target.stat().st_size > 10_000
    assert target.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    page.close()


def test_page_when_deal_settles_on_chain_then_shows_status_and_tx_hashes(
    server: str, data_dir: Path, browser: Any
) -> None:
    client, provider = Trader(), Trader()
    now = int(time.time())
    _post(server, "/v1/orders", provider.ask(now, device_class="cpu", price=10, quantity=1))
    fill = _post(server, "/v1/orders", client.bid(now, device_class="cpu", price=10, quantity=1))
    _post(server, "/v1/providers/heartbeat", provider.heartbeat(now, device_class="cpu"))
    deal_id = fill["fills"][0]["id"]
    opened, paid = "0x" + "ab" * 32, "0x" + "cd" * 32
    # What the indexer writes when the deal opens and a voucher pays two tasks.
    engine = make_engine(url=database_url(data_dir=data_dir, url=None))
    with Session(engine) as session:
        deal = session.get(Deal, deal_id)
        assert deal is not None
        deal.chain_deal_id = 4_242
        session.add(deal)
        session.add(
            ChainDeal(
                chain_deal_id=4_242, client=client.address, provider=provider.address,
                arbiter=provider.arbiter, quote_hash=deal.quote_hash, plan_hash="0x" + "00" * 32,
                max_spend="10", stake="0", penalty="0", expiry=now + 3_600, challenge_window=60,
                slo_ms=100, opened_tx=opened, opened_block=7, last_tx=paid, tasks_paid=2,
                paid="8",
            )
        )  # fmt: skip
        session.add(
            ProviderClient(
                provider=provider.address, client=client.address, deals=1, paid="12345678",
                refunded="500", penalties="50000", refunds=1,
            )
        )  # fmt: skip
        session.commit()
    engine.dispose()
    page = browser.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(server + "/")
    row = page.locator("[data-testid=deals] tbody tr", has_text=deal_id)
    row.wait_for()
    text = row.inner_text()
    assert "paid" in text and "4242" in text
    assert row.locator(f"code[title='{opened}']").count() == 1
    assert row.locator(f"code[title='{paid}']").count() == 1
    # The provider's reputation: value paid (paying clients) / refunded + penalties.
    seller = page.locator("[data-testid=providers] tbody tr", has_text=provider.address[-4:])
    assert "12,345,678 (1) / 500 + 50,000" in seller.inner_text()
    assert errors == []
    page.close()


def test_docs_when_loaded_under_the_pages_csp_then_every_route_shows_without_errors(
    server: str, browser: Any
) -> None:
    """The API reference is the market's own page (no CDN): it runs under the same
    Content-Security-Policy, and a CSP violation would be a console error."""
    page = browser.new_page()
    errors: list[str] = []
    external: list[str] = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.on("request", lambda r: None if r.url.startswith(server) else external.append(r.url))
    response = page.goto(server + "/docs")
    assert response is not None
    assert "frame-ancestors 'none'" in response.headers["content-security-policy"]
    page.wait_for_selector("[data-testid=operations] section")
    shown = page.locator("[data-testid=operations]").inner_text()
    paths = httpx.get(server + "/openapi.json", timeout=10).json()["paths"]
    for path in paths:
        assert path in shown
    assert page.locator("[data-testid=schemas] details").count() >= 10
    assert errors == [] and external == []
    page.close()


def test_page_when_framed_by_another_origin_then_the_browser_refuses(
    server: str, browser: Any, tmp_path: Path
) -> None:
    framing = tmp_path / "frame.html"
    framing.write_text(f'<iframe id="f" src="{server}/"></iframe>')
    page = browser.new_page()
    with page.expect_event(
        "console", predicate=lambda m: "frame-ancestors 'none'" in m.text, timeout=15_000
    ) as refused:
        page.goto(framing.as_uri())
    assert "has been blocked" in refused.value.text
    page.close()
