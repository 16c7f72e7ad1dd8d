"""The web order book in real headless Chromium (Debian's, driven by Playwright)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlmodel import Session

from market.database import database_url, make_engine
from market.models import ChainDeal, Deal, Provider, ProviderClient

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


TOKEN = 1_000_000
"""One token of 6 decimals, in base units."""


def _cells(page: Any, rows: str) -> list[list[str]]:
    """Return the text of each cell of each row (textContent: it needs no layout)."""
    found: list[list[str]] = page.eval_on_selector_all(
        rows, "rows => rows.map(r => [...r.cells].map(c => c.textContent.trim()))"
    )
    return found


def _seed(url: str) -> tuple[Trader, Trader]:
    client, provider = Trader(), Trader()
    now = int(time.time())
    orders = [provider.ask(now, price=TOKEN + 10_000 * i, quantity=5 + i) for i in range(4)]
    orders += [client.bid(now, price=950_000 - 10_000 * i, quantity=3 + i) for i in range(4)]
    _post(url, "/v1/orders/batch", {"orders": orders})
    _post(url, "/v1/orders", client.bid(now, price=1_010_000, quantity=7))  # 5 @1.00, 2 @1.01
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
    asks = _cells(page, "[data-testid=asks] tbody tr")
    # 6 - 2 left at 1.01 tokens, with the terms that decide what it can trade with
    assert asks[0] == ["1.01", "4", "1", "100 ms", "16 GiB", "metered"]
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
    _post(server, "/v1/orders", Trader().bid(now, price=770_000, quantity=42))
    page.wait_for_function(
        "() => [...document.querySelectorAll('[data-testid=bids] tbody tr')]"
        ".some(r => r.innerText.includes('42') && r.innerText.includes('0.77'))",
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
    # The provider's reputation: tokens paid (paying clients) / refunded + penalties.
    seller = page.locator("[data-testid=providers] tbody tr", has_text=provider.address[-4:])
    assert "12.345678 (1) / 0.0005 + 0.05" in seller.inner_text()  # in tokens
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


# -- a buyer's page: offers, filters, the command, at desktop and phone widths -----------------

VIEWPORTS = {"desktop": (1400, 900), "phone": (390, 844)}
OVERFLOW_JS = """() => {
  const width = document.documentElement.clientWidth;
  const out = [];
  for (const e of document.body.querySelectorAll('*')) {
    if (e.parentElement.closest('.scroll')) continue;  // a table scrolls in its own container
    const r = e.getBoundingClientRect();
    if (r.width && (r.right > width + 0.5 || r.left < -0.5)) {
      out.push(`${e.tagName}#${e.id}.${e.className} ${Math.round(r.left)}..${Math.round(r.right)}`);
    }
  }
  return {scroll: document.documentElement.scrollWidth, inner: window.innerWidth, out};
}"""


def _class_tab(page: Any, name: str) -> None:
    page.locator(f"[data-testid=classes] button[data-class='{name}']").click()
    page.wait_for_selector(f"[data-testid=classes] button.active[data-class='{name}']")


@pytest.mark.parametrize("viewport", VIEWPORTS)
def test_page_at_each_viewport_then_nothing_overflows_sideways_and_charts_have_axes(
    server: str, browser: Any, tmp_path: Path, viewport: str
) -> None:
    _seed(server)
    width, height = VIEWPORTS[viewport]
    page = browser.new_page()
    page.set_viewport_size({"width": width, "height": height})
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(server + "/")
    page.wait_for_selector("[data-testid=live].on")
    _class_tab(page, "tpu-v5e")
    page.wait_for_selector("[data-testid=offers] tbody tr")
    page.wait_for_selector("[data-testid=asks] tbody tr")
    page.wait_for_selector("[data-testid=fills] tbody tr")
    shot = tmp_path / f"market-{viewport}.png"
    page.screenshot(path=str(shot), full_page=True)
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 10_000
    layout = page.evaluate(OVERFLOW_JS)
    assert layout["scroll"] <= layout["inner"] == width and layout["out"] == [], layout
    for chart, titles in (
        ("depth-chart", ("price (tokens per unit)", "cumulative units")),
        ("history-chart", ("time (1-minute bars)", "price (tokens)")),
    ):
        axes = json.loads(page.locator(f"[data-testid={chart}]").get_attribute("data-axes"))
        assert (axes["xTitle"], axes["yTitle"]) == titles
        assert len(axes["x"]) >= 2 and len(axes["y"]) >= 2, axes
    stats = page.locator("[data-testid=stats]").inner_text()
    assert "1.01 tokens" in stats and "units in" in stats  # the last trade: 2 units @1.01
    assert errors == []
    page.close()


def test_tab_and_take_focus_when_trades_redraw_the_page_then_the_keyboard_stays_where_it_was(
    server: str, browser: Any
) -> None:
    """A live update redraws the page; a keyboard user's focus must not fall back to the top."""
    client, provider = Trader(), Trader()
    now = int(time.time())
    for device_class in ("cpu-x", "cpu-y"):  # both tabs there before the page loads
        _post(server, "/v1/orders", provider.ask(now, device_class=device_class, price=300_000))
    page = browser.new_page()
    page.goto(server + "/")
    page.wait_for_selector("[data-testid=live].on")
    _class_tab(page, "cpu-x")
    page.wait_for_selector("[data-testid=offers] tbody tr .take-button")
    focused = "() => document.activeElement.dataset.class || document.activeElement.className"
    for target, price in (
        ("[data-testid=classes] button[data-class='cpu-x']", 201_000),
        ("[data-testid=offers] .take-button", 202_000),
    ):
        page.focus(target)
        _post(server, "/v1/orders", provider.ask(now, device_class="cpu-y", price=price))
        _post(server, "/v1/orders", client.bid(now, device_class="cpu-y", price=price))
        page.wait_for_function(
            "p => [...document.querySelectorAll('[data-testid=classes] button')]"
            ".some(b => b.innerText.includes(p))",
            arg=f"{price / 1_000_000:g}",
        )
        assert page.evaluate(focused) in ("cpu-x", "take-button"), target
    page.close()


def test_page_when_a_read_fails_then_it_reads_again_without_waiting_for_a_change(
    server: str, browser: Any
) -> None:
    """A read refused by the network (a connection the server closed, a restart) is retried;
    the press that caused it is not left undone until the market next changes."""
    _seed(server)
    _post(server, "/v1/orders", Trader().bid(int(time.time()), device_class="cpu-z", price=90_000))
    page = browser.new_page()
    page.goto(server + "/")
    page.wait_for_selector("[data-testid=live].on")
    page.wait_for_selector("[data-testid=classes] button.active")
    failed: list[str] = []

    def fail_once(route: Any) -> None:
        if failed:
            route.continue_()
        else:
            failed.append(route.request.url)
            route.abort("connectionreset")

    page.route("**/v1/overview", fail_once)
    other = page.locator("[data-testid=classes] button:not(.active)").first
    name = other.get_attribute("data-class")
    _class_tab(page, name)
    assert len(failed) == 1
    page.close()


@pytest.fixture(scope="module")
def v6e(server: str) -> dict[str, Trader]:
    """Class tpu-v6e: two providers' offers on different terms, and two bids."""
    now = int(time.time())
    fast, spot, buyer = Trader(), Trader(), Trader()
    for provider, kind in ((fast, "TPU v6e"), (spot, "TPU v6e spot")):
        heartbeat = provider.heartbeat(now, device_class="tpu-v6e", device_kind=kind)
        _post(server, "/v1/providers/heartbeat", heartbeat)
    big = 32 << 30
    ask = fast.ask(now, device_class="tpu-v6e", price=2_500_000, quantity=3, slo_ms=50, memory=big)
    _post(server, "/v1/orders", ask)
    _post(
        server,
        "/v1/orders",
        spot.ask(
            now, device_class="tpu-v6e", price=1_200_000, quantity=9, slo_ms=300, memory=8 << 30
        ),
    )
    # Crosses the spot ask's price, but needs 100 ms and 16 GiB: only the fast ask could serve it.
    _post(
        server,
        "/v1/orders",
        buyer.bid(
            now, device_class="tpu-v6e", price=2_000_000, quantity=2, slo_ms=100, memory=16 << 30
        ),
    )
    return {"fast": fast, "spot": spot, "buyer": buyer}


def _offer_rows(page: Any) -> list[str]:
    return [" ".join(row) for row in _cells(page, "[data-testid=offers] tbody tr")]


def test_offers_when_sorted_filtered_and_taken_then_the_exact_command_shows(
    server: str, browser: Any, tmp_path: Path, v6e: dict[str, Trader]
) -> None:
    page = browser.new_page()
    page.set_viewport_size({"width": 390, "height": 844})
    page.goto(server + "/")
    page.wait_for_selector("[data-testid=live].on")
    _class_tab(page, "tpu-v6e")
    page.wait_for_function("() => document.querySelectorAll('[data-testid=offers] tbody tr')"
                           ".length === 2")  # fmt: skip
    rows = _offer_rows(page)
    assert "1.2" in rows[0] and "TPU v6e spot" in rows[0] and "300 ms" in rows[0]
    assert "2.5" in rows[1] and "new" in rows[1] and "32 GiB" in rows[1]  # nothing settled
    assert "%" not in rows[1]
    page.locator("[data-testid=offers] th button[data-sort=price]").click()  # now descending
    page.wait_for_function(
        "() => document.querySelector('[data-testid=offers] tbody tr').innerText.includes('2.5')"
    )
    assert page.locator("th[aria-sort=descending] button[data-sort=price]").count() == 1
    page.locator("[data-testid=offer-filters] input[name=max_slo_ms]").fill("100")
    page.locator("[data-testid=offer-filters] input[name=max_slo_ms]").press("Tab")
    page.wait_for_function("() => document.querySelectorAll('[data-testid=offers] tbody tr')"
                           ".length === 1")  # fmt: skip
    assert v6e["fast"].address[-4:] in _offer_rows(page)[0]
    page.locator("[data-testid=offers] tbody tr button.take-button").click()
    command = page.locator("[data-testid=command]")
    command.wait_for()
    [offer] = httpx.get(
        server + "/v1/offers", params={"device_class": "tpu-v6e", "max_slo_ms": 100}, timeout=10
    ).json()
    lines = command.inner_text().splitlines()
    assert lines[0].startswith(f"export TPUMARKET_MARKET_URL={server} TPUMARKET_ESCROW=0x")
    assert (
        lines[1]
        == offer["command"]
        == (
            "tpumarket client bid --device-class tpu-v6e --plan metered --slo-ms 50 "
            f"--memory {32 << 30} --price 2.5 --quantity 3"
        )
    )
    layout = page.evaluate(OVERFLOW_JS)
    assert layout["scroll"] <= 390 and layout["out"] == [], layout
    page.screenshot(path=str(tmp_path / "offer-taken-phone.png"), full_page=True)
    page.close()


def test_book_when_buyer_picks_terms_then_only_levels_that_trade_and_a_real_spread(
    server: str, browser: Any, tmp_path: Path, v6e: dict[str, Trader]
) -> None:
    page = browser.new_page()
    page.goto(server + "/")
    page.wait_for_selector("[data-testid=live].on")
    _class_tab(page, "tpu-v6e")
    spread = page.locator("[data-testid=spread]")
    page.wait_for_function(
        "() => document.querySelector('[data-testid=spread]').innerText.includes('mixed terms')"
    )  # best bid 2.0 above best ask 1.2: they cannot trade (SLO and memory), so no spread
    assert "best bid 2 · best ask 1.2" in spread.inner_text()
    filters = page.locator("[data-testid=book-filters]")
    filters.locator("select[name=plan]").select_option("metered")
    filters.locator("select[name=slo_ms]").select_option("100")
    filters.locator("select[name=memory]").select_option(str(16 << 30))
    page.wait_for_function(
        "() => document.querySelector('[data-testid=spread]').innerText.includes('spread 0.5')"
    )
    assert spread.inner_text() == "best bid 2 · best ask 2.5 · spread 0.5"
    assert _cells(page, "[data-testid=asks] tbody tr")[0][:2] == ["2.5", "3"]
    page.screenshot(path=str(tmp_path / "book-filtered.png"), full_page=True)
    page.close()


def test_recent_matches_when_classes_trade_within_one_second_then_newest_first(
    server: str, browser: Any
) -> None:
    client, provider = Trader(), Trader()
    now = int(time.time())
    for i, device_class in enumerate(("cpu-b", "cpu-c", "cpu-b", "cpu-c", "cpu-b")):
        price = 310_000 + 10_000 * i
        _post(server, "/v1/orders", provider.ask(now, device_class=device_class, price=price))
        _post(server, "/v1/orders", client.bid(now, device_class=device_class, price=price))
    newest = httpx.get(server + "/v1/fills", params={"limit": 1}, timeout=10).json()[0]
    assert (newest["device_class"], newest["price"]) == ("cpu-b", 350_000)
    page = browser.new_page()
    page.goto(server + "/")
    page.wait_for_selector("[data-testid=live].on")
    page.locator("[data-testid=fills] tbody tr").first.wait_for()
    assert _cells(page, "[data-testid=fills] tbody tr")[0][1:4] == ["cpu-b", "0.35", "10"]
    page.close()


# -- accessibility: WCAG 2.1 AA by axe-core, at phone and desktop widths ------------------------

AXE = ROOT / "node_modules" / "axe-core" / "axe.min.js"
AXE_RUN = """async () => {
  const result = await axe.run(document, {
    runOnly: {type: "tag", values: ["wcag2a", "wcag2aa", "wcag21a", "wcag21aa"]},
    rules: {"target-size": {enabled: true}},
  });
  return result.violations.map(v => ({
    id: v.id, impact: v.impact, help: v.help,
    nodes: v.nodes.slice(0, 5).map(n => n.target.join(" ") + ": " + n.failureSummary),
  }));
}"""


@pytest.mark.parametrize("viewport", {"desktop": (1400, 900), "phone": (375, 812)})
def test_page_when_checked_by_axe_at_each_width_then_no_wcag_21_aa_violation(
    server: str, browser: Any, v6e: dict[str, Trader], viewport: str
) -> None:
    _seed(server)
    page = browser.new_page()
    width = 1400 if viewport == "desktop" else 375
    page.set_viewport_size({"width": width, "height": 900})
    page.goto(server + "/")
    page.wait_for_selector("[data-testid=live].on")
    _class_tab(page, "tpu-v6e")
    page.wait_for_selector("[data-testid=offers] tbody tr")
    page.wait_for_selector("[data-testid=asks] tbody tr")
    page.evaluate(AXE.read_text() + "\n;0")  # evaluated, not a <script>: the page's CSP stands
    violations = page.evaluate(AXE_RUN)
    assert violations == [], json.dumps(violations, indent=1)
    page.close()


def test_page_at_phone_width_then_targets_reachable_prices_visible_and_labels_say_what(
    server: str, browser: Any, v6e: dict[str, Trader]
) -> None:
    page = browser.new_page()
    page.set_viewport_size({"width": 375, "height": 812})
    page.goto(server + "/")
    page.wait_for_selector("[data-testid=live].on")
    _class_tab(page, "tpu-v6e")
    page.wait_for_selector("[data-testid=offers] tbody tr")
    tabs = page.eval_on_selector_all(
        "[data-testid=classes] button",
        "bs => bs.map(b => [b.dataset.class, b.getAttribute('aria-pressed')])",
    )
    assert ["tpu-v6e", "true"] in tabs and all(p in ("true", "false") for _, p in tabs)
    assert [p for _, p in tabs].count("true") == 1
    # Every control a finger taps is at least 24 px both ways (links inside a sentence aside).
    small = page.evaluate(
        """() => [...document.querySelectorAll('button, input, select, .scroll')]
          .map(e => [e.name || e.dataset.sort || e.dataset.class || e.className,
                     e.getBoundingClientRect()])
          .filter(([, r]) => r.width && (r.width < 24 || r.height < 24))
          .map(([n, r]) => `${n} ${Math.round(r.width)}x${Math.round(r.height)}`)"""
    )
    assert small == []
    # The first offer's price is on screen without scrolling sideways.
    price = page.locator("[data-testid=offers] tbody tr td.price").first.bounding_box()
    assert price is not None and price["x"] >= 0 and price["x"] + price["width"] <= 375
    # Each table's scroll box takes the keyboard's focus.
    for box in page.locator(".scroll").all():
        assert box.get_attribute("tabindex") == "0" and box.get_attribute("aria-label")
    # The red of asks on a card reads at 4.5:1 or more.
    ratio = page.evaluate(
        """() => {
          const lum = (c) => { const v = c.match(/\\d+/g).slice(0, 3).map(Number).map(x => x / 255)
            .map(x => x <= 0.03928 ? x / 12.92 : ((x + 0.055) / 1.055) ** 2.4);
            return 0.2126 * v[0] + 0.7152 * v[1] + 0.0722 * v[2]; };
          const cell = document.querySelector('tr.ask td.price');
          const card = getComputedStyle(document.querySelector('.card')).backgroundColor;
          const a = lum(getComputedStyle(cell).color), b = lum(card);
          return (Math.max(a, b) + 0.05) / (Math.min(a, b) + 0.05);
        }"""
    )
    assert ratio >= 4.5
    bid_heads = _cells(page, "[data-testid=bids] thead tr")  # th cells are cells too
    assert bid_heads[0][3:5] == ["needs SLO ≤", "needs memory ≥"]
    assert _cells(page, "[data-testid=asks] thead tr")[0][3:5] == ["offers SLO ≤", "offers memory"]
    assert page.locator("[data-testid=offers] thead th").first.inner_text() == "take the offer"
    # The Market card explains a best bid above the best ask that cannot trade.
    quote = page.locator("#stat-quote").inner_text()
    assert quote.startswith("2 / 1.2 (mixed terms") and "cannot trade" in quote
    for chart in ("depth-chart", "history-chart"):
        label = page.locator(f"[data-testid={chart}]").get_attribute("aria-label")
        assert page.locator(f"[data-testid={chart}]").get_attribute("role") == "img"
        assert label and ("units" in label or "no " in label), label
    assert "bids 2 units from 2 to 2 tokens" in (
        page.locator("[data-testid=depth-chart]").get_attribute("aria-label") or ""
    )
    page.close()


def _offers_after(page: Any, count: int) -> list[str]:
    page.wait_for_function(
        f"() => document.querySelectorAll('[data-testid=offers] tbody tr').length === {count}"
    )
    return _offer_rows(page)


def test_announce_when_a_read_was_under_way_at_a_filter_change_then_says_what_it_shows(
    server: str, browser: Any, v6e: dict[str, Trader]
) -> None:
    """A live update's read under way when the person changes a filter shows the filters as they
    were; the live region must speak for the read the change asked for, not that one."""
    page = browser.new_page()
    page.goto(server + "/")
    page.wait_for_selector("[data-testid=live].on")
    _class_tab(page, "tpu-v6e")
    _offers_after(page, 2)
    held: list[Any] = []

    def hold(route: Any) -> None:  # the first offers read waits; the others pass
        if held:
            route.continue_()
        else:
            held.append(route)

    page.route("**/v1/offers?*", hold)
    page.evaluate("() => { refresh(); }")  # as a live update does
    page.wait_for_function("() => state.fetching")
    while not held:
        page.wait_for_timeout(10)  # let the page run until its offers read reaches the hold
    price = page.locator("[data-testid=offer-filters] input[name=max_price_tokens]")
    price.fill("1.5")
    price.press("Tab")  # the change: its read waits for the one under way
    held[0].continue_()
    assert "1.2" in _offers_after(page, 1)[0]
    page.wait_for_function("() => !state.fetching")
    assert page.locator("[data-testid=announce]").inner_text().startswith("1 offer,")
    page.close()


def _announced(page: Any, start: str) -> None:
    """Wait until the live region's text begins with `start`."""
    page.wait_for_function(
        "start => document.querySelector('[data-testid=announce]').innerText.startsWith(start)",
        arg=start,
    )


def test_offer_filters_when_typed_wrong_then_said_and_by_provider_and_device_kind(
    server: str, browser: Any, v6e: dict[str, Trader]
) -> None:
    page = browser.new_page()
    page.goto(server + "/")
    page.wait_for_selector("[data-testid=live].on")
    _class_tab(page, "tpu-v6e")
    _offers_after(page, 2)
    filters = page.locator("[data-testid=offer-filters]")
    price = filters.locator("input[name=max_price_tokens]")
    price.fill("1.5")
    price.press("Tab")
    assert "1.2" in _offers_after(page, 1)[0]
    _announced(
        page, "1 offer,"
    )  # by the read the change asked for (a live update's may come first)
    price.fill("1e-3")  # 0.001 tokens: no offer that cheap (it was silently ignored)
    price.press("Tab")
    _offers_after(page, 0)
    assert price.get_attribute("aria-invalid") is None
    price.fill("-1")
    price.press("Tab")
    errors = page.locator("[data-testid=filter-errors]")
    errors.get_by_text("must not be negative").wait_for()
    assert price.get_attribute("aria-invalid") == "true"
    assert "price ≤: “-1” must not be negative; not applied" in errors.inner_text()
    _offers_after(page, 2)  # not applied: both offers
    price.fill("abc")
    price.press("Tab")
    errors.get_by_text("is not a number").wait_for()
    reliability = filters.locator("input[name=min_reliability_pct]")
    reliability.fill("150")
    reliability.press("Tab")
    errors.get_by_text("must be at most 100").wait_for()
    price.fill("")
    reliability.fill("")
    reliability.press("Tab")
    page.wait_for_function(
        "() => !document.querySelector('[data-testid=filter-errors]').innerText.trim()"
    )
    filters.locator("select[name=device_kind]").select_option("TPU v6e spot")
    [spot] = _offers_after(page, 1)
    assert v6e["spot"].address[-4:] in spot
    filters.locator("select[name=device_kind]").select_option("")
    _offers_after(page, 2)
    filters.locator("select[name=provider]").select_option(v6e["fast"].address)
    [fast] = _offers_after(page, 1)
    assert v6e["fast"].address[-4:] in fast and "2.5" in fast
    page.close()


HOSTILE_KIND = '<img src=x onerror="document.title=1">\u202e TPU'
HOSTILE_URLS = (
    "javascript:document.title='pwned'",
    "data:text/html,<b>x</b>",
    "https://ok.example:8443/",
)


def test_page_when_the_api_serves_hostile_provider_strings_then_text_and_http_links_only(
    server: str, browser: Any, v6e: dict[str, Trader]
) -> None:
    """The page is checked on its own: the overview it reads is replaced by one whose
    provider strings are hostile (the API refuses them: `test_adverts.py`)."""
    page = browser.new_page()
    overview = httpx.get(server + "/v1/overview", timeout=10).json()
    base = overview["providers"][0]
    overview["providers"] = [
        base | {"address": "0x" + f"{i:040x}", "device_kind": HOSTILE_KIND, "endpoint": url}
        for i, url in enumerate(HOSTILE_URLS)
    ]

    def serve(route: Any) -> None:
        route.fulfill(status=200, content_type="application/json", body=json.dumps(overview))

    page.route("**/v1/overview", serve)
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(server + "/")
    table = page.locator("[data-testid=providers]")
    table.locator("tbody tr").nth(2).wait_for()
    assert table.locator("img").count() == 0
    assert page.title() != "1" and page.title() != "pwned"
    assert table.inner_text().count("<img src=x") == 3  # shown as text
    links = table.locator("a").all()
    assert [link.get_attribute("href") for link in links] == ["https://ok.example:8443/"]
    assert "javascript:document.title='pwned'" in table.inner_text()
    assert errors == []
    page.close()


def test_hostile_adverts_when_posted_then_refused_and_an_older_row_shows_as_plain_text(
    server: str, data_dir: Path, browser: Any
) -> None:
    """Over real HTTP: each hostile advert is refused naming its field; a row stored before
    the rule (written to the database here) reaches the API and the page defused."""
    attacker = Trader()
    now = int(time.time())
    for field, value in (
        ("device_kind", '<img src=x onerror="document.title=1">'),
        ("device_kind", "TPU\u202e\x1b[31m"),
        ("endpoint", "javascript:document.title='pwned'"),
    ):
        body = attacker.heartbeat(now, device_class="cpu-x", **{field: value})
        response = httpx.post(server + "/v1/providers/heartbeat", json=body, timeout=10)
        assert response.status_code == 422
        assert response.json()["problems"][0]["loc"] == ["body", "advert", field]
    _post(server, "/v1/providers/heartbeat", attacker.heartbeat(now, device_class="cpu-x"))
    engine = make_engine(url=database_url(data_dir=data_dir, url=None))
    with Session(engine) as session:
        row = session.get(Provider, attacker.address)
        assert row is not None
        row.device_kind = '<img src=x onerror="document.title=1">'
        row.endpoint = "javascript:document.title='pwned'"
        session.add(row)
        session.commit()
    engine.dispose()
    listed = {p["address"]: p for p in httpx.get(server + "/v1/providers", timeout=10).json()}
    shown = listed[attacker.address]
    assert shown["endpoint"] == "" and shown["device_kind"].startswith("\ufffdimg src=x")
    page = browser.new_page()
    page.goto(server + "/")
    row_shown = page.locator("[data-testid=providers] tbody tr", has_text=attacker.address[-4:])
    row_shown.wait_for()
    assert row_shown.locator("img, a").count() == 0
    assert "\ufffdimg src=x" in row_shown.inner_text()
    assert page.title() not in ("1", "pwned")
    page.close()
