"""A daemon re-posts its ask as soon as a fill takes the last of its units off the book.

Real processes: anvil, the market and a provider daemon started by its CLI with an ``[ask]``
in its config. The ask's refresh turn is set far off (a tenth of a two-hour expiry: 12
minutes), so only the fill itself, seen by the daemon's quote job, can bring a fresh ask
within the test's wait.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx

from contracts.chain import free_port
from contracts.messages import Plan, address_of
from tests.e2e.stack import (
    DEVICE_CLASS,
    PROVIDER_STAKE,
    WINDOW,
    Process,
    Provider,
    Stack,
    bid,
    stack,
)
from tests.polling import wait_until
from tests.provider.daemon_support import LEAN_SANDBOX_TOML

PLAN = Plan(compile_price=1_000, inference_price=2_000)
PRICE = 2_000
SLO_MS = 60_000
EXPIRY_S = 7_200


def start_asking_provider(st: Stack, name: str) -> Provider:
    """Stake for a fresh key and start a daemon whose config carries a one-unit ``[ask]``."""
    key = st.spare_keys.pop()
    st.token.mint(st.deployer, address_of(key), PROVIDER_STAKE)
    st.token.approve(key, st.escrow.address, PROVIDER_STAKE)
    st.escrow.stake(key, PROVIDER_STAKE)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    lines = [
        f'rpc_url = "{st.rpc_url}"',
        f'escrow = "{st.escrow.address}"',
        f'data_dir = "{st.work / name}"',
        f'market_url = "{st.market_url}"',
        f'public_url = "{url}"',
        'host = "127.0.0.1"',
        f"port = {port}",
        "pool_size = 1",
        f"slo_ms = {SLO_MS}",
        'jax_platforms = "cpu"',
        "benchmark_on_start = false",
        *LEAN_SANDBOX_TOML.splitlines(),
        'log_level = "INFO"',
        "[plan]",
        *(f"{k} = {str(v).lower()}" for k, v in PLAN.to_json().items()),
        "[settlement]",
        "interval_s = 1",
        "tx_allowance_s = 2",
        "[ask]",
        f"price = {PRICE}",
        "quantity = 1",
        "stake = 10000",
        "penalty = 1000",
        f'arbiter = "{address_of(st.arbiter)}"',
        f"challenge_window = {WINDOW}",
        f"expiry_s = {EXPIRY_S}",
        f'device_class = "{DEVICE_CLASS}"',
        "compile_checks = false",
    ]
    config = st.work / f"{name}.toml"
    config.write_text("\n".join(lines) + "\n")
    process = Process(
        name,
        ["-m", "provider.cli", "run", "--config", str(config)],
        st.work / f"{name}.log",
        {"TPUMARKET_PROVIDER_PRIVATE_KEY": key, "JAX_PLATFORMS": "cpu"},
    )
    st.processes.append(process)
    provider = Provider(name, key, PLAN, SLO_MS, url, process)
    st.providers.append(provider)
    process.start()
    provider.ready()
    return provider


def live_asks(st: Stack, provider: Provider) -> list[dict[str, Any]]:
    """The provider's live asks the market lists."""
    reply = httpx.get(
        f"{st.market_url}/v1/orders",
        params={"owner": provider.address, "live": "true"},
        timeout=30,
    )
    reply.raise_for_status()
    return [o for o in reply.json() if o.get("side") == "ask"]


def test_ask_when_a_fill_takes_its_last_unit_then_the_daemon_posts_a_fresh_one_at_once(
    tmp_path: Path,
) -> None:
    with stack(tmp_path, market=True) as st:
        provider = start_asking_provider(st, "asking")
        wait_until(lambda: len(live_asks(st, provider)) == 1, 60, "the daemon's first ask")
        first = live_asks(st, provider)[0]["order_id"]
        st.escrow.deposit(st.client, PRICE)  # the market takes funded bids only

        _, deals = bid(st, price=PRICE, quantity=1, plan="flat", slo_ms=SLO_MS)

        assert [d["provider"].lower() for d in deals] == [provider.address.lower()]

        def fresh() -> bool:
            return any(o["order_id"] != first for o in live_asks(st, provider))

        wait_until(fresh, 30, "a fresh ask after the fill")
        asks = live_asks(st, provider)
        assert first not in {o["order_id"] for o in asks}  # the filled one left the book
        assert [(o["device_class"], o["quantity"]) for o in asks] == [(DEVICE_CLASS, 1)]
