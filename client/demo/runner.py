"""The whole run, step by step: chain, market, providers, client, workload, settlement."""

from __future__ import annotations

import contextlib
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from client.accounts import ClientAccount
from client.demo.deals import bid_and_open, post_ask, run_workload
from client.demo.processes import Processes, start_market, start_provider
from client.demo.settlement import close_deals, refund_late, vouch
from client.demo.summary import Summary, print_figures, print_settlements, print_table, summarize
from client.demo.terms import (
    ALPHA,
    BETA,
    CHALLENGE_WINDOW,
    CLIENT_DEPOSIT,
    CLIENT_FUNDS,
    PROVIDER_STAKE,
    START_TIMEOUT_S,
)
from client.demo.text import Say, tokens
from client.demo.workload import build_workload
from client.market_http import MarketHttp
from contracts.binding import Chain
from contracts.chain import Anvil, dev_keys
from contracts.messages import address_of
from contracts.orders import plan_kind


@dataclass
class DemoOptions:
    """What the command line can change."""

    json: bool = False
    keep_running: bool = False
    rpc_url: str | None = None  # an anvil with the dev mnemonic; default: start one
    work_dir: Path | None = None


def run(options: DemoOptions, say: Say, report: Callable[[Summary], None] | None = None) -> Summary:
    """Run the whole demo; stop every process it started, even on errors.

    ``report`` gets the summary as soon as it is known (before ``--keep-running`` waits).
    """
    work = options.work_dir or Path(tempfile.mkdtemp(prefix="tpumarket-demo-"))
    (work / "logs").mkdir(parents=True, exist_ok=True)
    processes = Processes(work / "logs")
    anvil: Anvil | None = None
    ok = False
    if threading.current_thread() is threading.main_thread():
        # A SIGTERM unwinds like Ctrl-C, so the `finally` below stops every process we started.
        signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        if options.rpc_url is None:
            anvil = Anvil.start(accounts=6)
            rpc_url, keys = anvil.url, anvil.keys
        else:
            rpc_url, keys = options.rpc_url, dev_keys(6)
        summary = _run(options, say, processes, work, rpc_url, keys)
        ok = True
        if report is not None:
            report(summary)
        if options.keep_running:
            _wait_for_interrupt()
        return summary
    finally:
        processes.stop_all()
        if anvil is not None:
            anvil.stop()
        if ok and options.work_dir is None:
            shutil.rmtree(work, ignore_errors=True)
        elif not ok:
            say(f"logs kept in {work / 'logs'}")


def _raise_interrupt(*_: object) -> None:
    raise KeyboardInterrupt


def _wait_for_interrupt() -> None:
    # On stderr: with --json the JSON object stays the last line of stdout.
    print("everything stays up: Ctrl-C (or SIGTERM) stops it", file=sys.stderr, flush=True)
    with contextlib.suppress(KeyboardInterrupt):
        threading.Event().wait()  # until Ctrl-C or SIGTERM (both raise KeyboardInterrupt)


def _run(
    options: DemoOptions,
    say: Say,
    processes: Processes,
    work: Path,
    rpc_url: str,
    keys: list[str],
) -> Summary:
    started = time.monotonic()
    deployer, client_key, alpha_key, beta_key, arbiter_key = keys[:5]
    operators = ((ALPHA, alpha_key), (BETA, beta_key))
    chain = Chain(rpc_url)
    deployment = chain.deploy(deployer, min_challenge_window=CHALLENGE_WINDOW)
    escrow, token = chain.escrow(deployment.escrow), chain.token(deployment.token)
    chain_id = escrow.domain.chain_id
    say(f"chain     {rpc_url} (chain id {chain_id})")
    say(f"token     {deployment.token}")
    say(f"escrow    {deployment.escrow} (challenge windows of {CHALLENGE_WINDOW} s and more)")
    for _, key in operators:  # the providers' operators stake before their daemons start
        token.mint(deployer, address_of(key), PROVIDER_STAKE)
        token.approve(key, escrow.address, PROVIDER_STAKE)
        escrow.stake(key, PROVIDER_STAKE)

    market_url = start_market(processes, work, rpc_url, escrow.address, chain_id)
    urls = {
        profile.name: start_provider(
            processes,
            profile,
            key,
            work,
            rpc_url=rpc_url,
            escrow=escrow.address,
            market_url=market_url,
        )
        for profile, key in operators
    }
    # Export the models while the daemons start their workers.
    workload = build_workload(say)
    processes.wait_http("market", market_url + "/healthz", START_TIMEOUT_S)
    say(f"market    {market_url}   <- web order book (open it in a browser)")
    for profile, _ in operators:
        url = urls[profile.name]
        processes.wait_http(profile.name, url + "/v1/health", START_TIMEOUT_S)
        say(f"provider  {profile.name:<6}{url}  {profile.note}")

    market = MarketHttp(market_url)
    arbiter = address_of(arbiter_key)
    for nonce, (profile, key) in enumerate(operators, start=1):
        post_ask(market, escrow, profile, key, arbiter, nonce)
        say(
            f"ask       {profile.name}: {profile.ask_quantity} units "
            f"at {tokens(profile.ask_price)}"
            f" ({plan_kind(profile.plan)} plan: compile {tokens(profile.plan.compile_price)},"
            f" inference {tokens(profile.plan.inference_price)}; SLO {profile.slo_ms} ms)"
        )

    client = address_of(client_key)
    token.mint(deployer, client, CLIENT_FUNDS)
    account = ClientAccount(
        escrow,
        token,
        client_key,
        spending_cap=CLIENT_DEPOSIT,
        min_challenge_window=CHALLENGE_WINDOW,
    )
    account.deposit(CLIENT_DEPOSIT)
    say(f"client    {client}: deposited {tokens(CLIENT_DEPOSIT)} (cap {tokens(CLIENT_DEPOSIT)})")
    providers = {address_of(k).lower(): (p, urls[p.name]) for p, k in operators}
    deals = bid_and_open(market, escrow, account, providers, say)
    try:
        # Pay per task: each verified delivery brings the deal's next cumulative voucher, while
        # the other tasks (the late one included) are still awaited.
        run_workload(deals, workload, say, on_verified=lambda d, o: vouch(d, say, o.index))
        refund_late(escrow, deals, say)
        for deal in deals:  # a task found delivered in time when asked once more is paid too
            vouch(deal, say)
        close_deals(escrow, account, deals, processes.check, say)
    finally:
        for deal in deals:
            deal.session.provider.close()
    account.withdraw(escrow.balance_of(client))
    summary, rows = summarize(escrow, deals)
    print_table(rows, say)
    print_settlements(summary, say)
    print_figures(summary, say)
    say(f"  client wallet        {tokens(token.balance_of(client))} after withdrawing")
    say(f"  wall time            {time.monotonic() - started:.0f} s")
    if options.keep_running:
        say(f"order book: {market_url} (up until Ctrl-C)")
    market.close()
    return summary
