"""Real processes for the end-to-end tests: anvil, the market and provider daemons by their CLIs.

Nothing here is a stand-in: the market runs as ``python -m market.cli market serve``, each
provider as ``python -m provider.cli run --config FILE``, and the client is the SDK or the
``tpumarket`` CLI. Providers' operators sign quotes and asks the way the demo's do.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from client.models import ExportedModel, export_jax
from contracts.binding import Chain, Escrow, Token
from contracts.chain import Anvil, free_port
from contracts.messages import ZERO_ADDRESS, Plan, Quote, address_of
from contracts.orders import Ask, Bid, market_domain, order_id, plan_kind
from contracts.tx_policy import TxPolicy
from tests import processes
from tests.polling import wait_until
from tests.provider.daemon_support import LEAN_SANDBOX_TOML

ROOT = Path(__file__).resolve().parents[2]
UNIT = 10**6
CLIENT_FUNDS = 100 * UNIT
PROVIDER_STAKE = 5 * UNIT
DEVICE_CLASS = "cpu"
SLOW_STEPS = 150_000_000  # ~3 s of device time on this CPU: past a 1 s SLO
# The escrow's shortest challenge window in these tests (the production default is 60 s): long
# enough for a daemon settling every second with a margin of half the window, short enough
# that a test waits for it in seconds. Tests that need the chain past a window move its clock.
MIN_WINDOW = 10
WINDOW = 10  # the window of the tests' quotes
_nonces = itertools.count(1)


class Process:
    """One subprocess (``python -m ...``) with its log; stopped by PID."""

    def __init__(self, name: str, args: list[str], log: Path, env: dict[str, str]) -> None:
        self.name, self.args, self.log, self.env = name, args, log, env
        self.popen: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        """Start the process, appending to its log."""
        with self.log.open("ab") as log:
            self.popen = processes.spawn(
                [sys.executable, *self.args],
                cwd=ROOT,
                stdout=log,
                stderr=subprocess.STDOUT,
                env={**os.environ, **self.env},
            )

    def wait_http(self, url: str, timeout_s: float = 120.0) -> None:
        """Wait until ``url`` answers 200, failing at once if the process exited."""

        def up() -> bool:
            assert self.popen is not None
            if self.popen.poll() is not None:
                raise AssertionError(f"{self.name} exited: {self.log.read_text()[-3000:]}")
            with contextlib.suppress(httpx.HTTPError):
                return httpx.get(url, timeout=2).status_code == 200
            return False

        wait_until(up, timeout_s, f"{self.name} at {url}")

    def signal(self, sig: signal.Signals) -> None:
        """Send ``sig`` to the process."""
        assert self.popen is not None
        os.kill(self.popen.pid, sig)

    def kill9(self) -> None:
        """SIGKILL the process (no cleanup of any kind) and reap it."""
        assert self.popen is not None
        os.kill(self.popen.pid, signal.SIGKILL)
        self.popen.wait(30)

    def stop(self) -> None:
        """SIGTERM its process group; SIGKILL what lingers."""
        if self.popen is not None:
            processes.stop(self.popen, grace_s=30)


@dataclass
class Provider:
    """A provider daemon process, its key, terms and URL."""

    name: str
    key: str
    plan: Plan
    slo_ms: int
    url: str
    process: Process

    @property
    def address(self) -> str:
        """Return the provider's address."""
        return address_of(self.key)

    def restart(self) -> None:
        """Start the daemon again on the same config, data dir and port."""
        self.process.start()
        self.ready()

    def ready(self) -> None:
        """Wait until the daemon answers its health check."""
        self.process.wait_http(self.url + "/v1/health")


@dataclass
class Stack:
    """A chain with the contracts, optionally the market, and the providers started on it."""

    anvil: Anvil
    chain: Chain
    escrow: Escrow
    token: Token
    deployer: str
    client: str
    arbiter: str
    spare_keys: list[str]
    work: Path
    market_url: str | None = None
    confirmations: int = 1
    lean: bool = False  # providers without standby sandbox processes (LEAN_SANDBOX)
    processes: list[Process] = field(default_factory=list)
    providers: list[Provider] = field(default_factory=list)

    @property
    def rpc_url(self) -> str:
        """Return the chain's RPC URL."""
        return self.anvil.url

    def start_market(self) -> str:
        """Start the market (SQLite) with its chain indexer; return its URL."""
        port = free_port()
        flags = ["--port", str(port), "--data-dir", str(self.work / "market")]
        flags += ["--rpc-url", self.rpc_url, "--escrow", self.escrow.address]
        flags += ["--chain-id", str(self.escrow.domain.chain_id)]
        process = Process(
            "market",
            ["-m", "market.cli", "market", "serve", *flags],
            self.work / "market.log",
            {
                "DATABASE_URL": "",
                "TPUMARKET_MARKET_INDEX_CONFIRMATIONS": str(self.confirmations - 1),
            },
        )
        self.processes.append(process)
        process.start()
        self.market_url = f"http://127.0.0.1:{port}"
        process.wait_http(self.market_url + "/healthz")
        return self.market_url

    def start_provider(
        self,
        name: str,
        plan: Plan,
        *,
        slo_ms: int = 60_000,
        settlement: dict[str, float] | None = None,
        wait: bool = True,
    ) -> Provider:
        """Stake for a fresh provider key and start its daemon; return it once healthy.

        With ``wait=False`` it returns as soon as the daemon is started: call ``ready()``.
        """
        key = self.spare_keys.pop()
        self.token.mint(self.deployer, address_of(key), PROVIDER_STAKE)
        self.token.approve(key, self.escrow.address, PROVIDER_STAKE)
        self.escrow.stake(key, PROVIDER_STAKE)
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        # Redeem every voucher at once; settle every second, allowing 2 s per transaction: the
        # daemon then serves windows from (1 + 2) / 0.5 = 6 s (MIN_WINDOW is 10).
        jobs: dict[str, float] = {"redeem_threshold": 1, "interval_s": 1, "tx_allowance_s": 2}
        if self.confirmations > 1:  # each transaction waits for its confirmations
            jobs.update(confirmations=self.confirmations, tx_allowance_s=2 * self.confirmations)
        jobs.update(settlement or {})
        lines = [
            f'rpc_url = "{self.rpc_url}"',
            f'escrow = "{self.escrow.address}"',
            f'data_dir = "{self.work / name}"',
            f'public_url = "{url}"',
            'host = "127.0.0.1"',
            f"port = {port}",
            "pool_size = 1",
            f"slo_ms = {slo_ms}",
            'jax_platforms = "cpu"',
            "benchmark_on_start = false",
            "heartbeat_interval_s = 2",
            'log_level = "WARNING"',
        ]
        if self.lean:
            lines += LEAN_SANDBOX_TOML.splitlines()
        if self.market_url:
            lines.append(f'market_url = "{self.market_url}"')
        lines.append("[plan]")
        lines += [f"{k} = {str(v).lower()}" for k, v in plan.to_json().items()]
        lines.append("[settlement]")
        lines += [f"{k} = {v}" for k, v in jobs.items()]
        config = self.work / f"{name}.toml"
        config.write_text("\n".join(lines) + "\n")
        process = Process(
            name,
            ["-m", "provider.cli", "run", "--config", str(config)],
            self.work / f"{name}.log",
            {"TPUMARKET_PROVIDER_PRIVATE_KEY": key, "JAX_PLATFORMS": "cpu"},
        )
        self.processes.append(process)
        provider = Provider(name, key, plan, slo_ms, url, process)
        self.providers.append(provider)
        process.start()
        if wait:
            provider.ready()
        return provider

    def quote(
        self,
        provider: Provider,
        *,
        max_spend: int,
        penalty: int = 50_000,
        window: int = WINDOW,
        client: str | None = None,
    ) -> Quote:
        """Return the quote a provider's operator signs for its terms, naming ``client``.

        ``client`` defaults to the stack's client; an ask's terms name nobody (ZERO_ADDRESS).
        """
        return Quote(
            provider=provider.address,
            client=address_of(self.client) if client is None else client,
            arbiter=address_of(self.arbiter),
            max_spend=max_spend,
            stake=UNIT,
            penalty=penalty,
            duration=3_600,
            challenge_window=window,
            slo_ms=provider.slo_ms,
            valid_until=self.anvil.latest_timestamp() + 1_800,
            nonce=next(_nonces),
            plan=provider.plan,
        )

    def open_deal(self, quote: Quote, provider: Provider) -> int:
        """Open a deal directly with a signed quote (no market); return its id."""
        signature = quote.sign(self.escrow.domain, provider.key)
        result = self.escrow.open_deal(self.client, quote, signature, quote.max_spend)
        return int(result.event("DealOpened").args["dealId"])

    def stop(self) -> None:
        """Stop every process, newest first, then anvil."""
        for process in reversed(self.processes):
            process.stop()
        self.anvil.stop()

    def escrow_solvent(self) -> bool:
        """Return whether the escrow's tokens are exactly what it owes: balances, stakes, deals."""
        held = self.token.balance_of(self.escrow.address)
        accounts = [address_of(self.client), *(p.address for p in self.providers)]
        owed = sum(self.escrow.balance_of(a) + self.escrow.stake_of(a) for a in accounts)
        for deal_id in range(1, self.escrow.deal_count() + 1):
            deal = self.escrow.get_deal(deal_id)
            owed += deal.locked + deal.stake
        return held == owed


@contextlib.contextmanager
def stack(
    work: Path,
    *,
    market: bool = False,
    min_challenge_window: int = MIN_WINDOW,
    block_time: float | None = None,
    confirmations: int = 1,
    lean: bool = False,
) -> Iterator[Stack]:
    """Start anvil, deploy, fund the client's wallet; stop everything after.

    With `block_time` the chain mines a block that often (not on each transaction) and keeps
    its history, so reorgs can be injected (`anvil_reorg`); every process then counts a
    transaction done, and the market indexes a block, only `confirmations` blocks deep.
    With `lean` each provider daemon starts no standby worker and no standby validator
    (`tests.provider.daemon_support.LEAN_SANDBOX`): for tests that exercise no replacement of a
    crashed worker or of a validator retired after malformed programs.
    """
    anvil = Anvil.start(accounts=10, block_time=block_time, keep_history=block_time is not None)
    try:
        chain = Chain(anvil.url, policy=TxPolicy(confirmations=confirmations))
        keys = anvil.keys
        deployment = chain.deploy(keys[0], min_challenge_window=min_challenge_window)
        escrow, token = chain.escrow(deployment.escrow), chain.token(deployment.token)
        token.mint(keys[0], address_of(keys[1]), CLIENT_FUNDS)
        token.approve(keys[1], escrow.address, 2**256 - 1)
        built = Stack(anvil, chain, escrow, token, keys[0], keys[1], keys[2], keys[3:], work)
        built.confirmations, built.lean = confirmations, lean
    except BaseException:
        anvil.stop()
        raise
    try:
        if market:
            built.start_market()
        yield built
    finally:
        built.stop()


# ---- the market ----------------------------------------------------------------------------


def post_ask(stack: Stack, provider: Provider, quote: Quote, price: int, quantity: int) -> str:
    """As the provider's operator: post an ask bound to its signed terms (``quote``).

    The ask's quote names no client (its terms only); after a match the provider's daemon signs
    a quote with these terms naming the fill's client.
    """
    from client.market_http import MarketHttp

    assert stack.market_url is not None
    quote = replace(quote, client=ZERO_ADDRESS)
    ask = Ask(
        owner=provider.address,
        device_class=DEVICE_CLASS,
        quantity=quantity,
        price=price,
        plan=plan_kind(provider.plan),
        slo_ms=provider.slo_ms,
        memory=0,
        expiry=quote.valid_until,
        nonce=quote.nonce,
        quote_hash=quote.struct_hash(),
    )
    domain = market_domain(stack.escrow.domain.chain_id, stack.escrow.address)
    market = MarketHttp(stack.market_url)
    try:
        market.place_order(
            ask,
            ask.sign(domain, provider.key),
            quote=quote,
            quote_signature=quote.sign(stack.escrow.domain, provider.key),
        )
    finally:
        market.close()
    return order_id(ask, domain)


def bid(
    stack: Stack, *, price: int, quantity: int, plan: str, slo_ms: int
) -> tuple[str, list[dict[str, Any]]]:
    """As the client: place a signed bid and wait for its deals; return (bid id, deals)."""
    from client.market_http import MarketHttp

    assert stack.market_url is not None
    domain = market_domain(stack.escrow.domain.chain_id, stack.escrow.address)
    order = Bid(
        owner=address_of(stack.client),
        device_class=DEVICE_CLASS,
        quantity=quantity,
        price=price,
        plan=plan,
        slo_ms=slo_ms,
        memory=0,
        expiry=stack.anvil.latest_timestamp() + 1_800,
        nonce=next(_nonces),
    )
    market = MarketHttp(stack.market_url)
    try:
        market.place_bid(order, domain, stack.client)
        bid_id = order_id(order, domain)
        return bid_id, market.wait_for_deals(address_of(stack.client), bid_id)
    finally:
        market.close()


# ---- programs ------------------------------------------------------------------------------


def spin_model() -> ExportedModel:
    """Export ``spin(steps, x)``: a loop whose length (device time) each task chooses."""
    from client.demo.workload import spin

    return export_jax(spin, example_inputs=[np.array([10], np.int32), np.ones(4, np.float32)])


def spin_inputs(model: ExportedModel, steps: int, seed: int) -> dict[str, Any]:
    """Return one task's inputs, named by flat index, as a job inputs file holds them."""
    x = np.full(4, float(seed), np.float32)
    return model.signature.bind_inputs([np.array([steps], np.int32), x])
