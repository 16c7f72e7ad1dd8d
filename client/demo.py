"""The whole market end to end on a local chain: what `make demo` and `tpumarket demo` run.

One command, embedded defaults: start anvil, deploy the token and the escrow, start the market
(SQLite, with its chain indexer) and two provider daemons as subprocesses, each with its own
data dir, port and price. Provider "alpha" is dearer and keeps a generous SLO; provider "beta"
is cheaper but promises a 1 s SLO on one worker, which it cannot keep. Their operators stake
and post signed asks with signed quotes. A funded client bids, is matched against both asks,
opens both deals on chain with the providers' quotes and runs a real workload:

- TPU v5e compile-checks (target ``v5e:1x1``) on alpha: the Silero VAD model (fits) and an
  oversized dense layer (runs out of HBM: diagnosed ``oom`` with required vs available bytes);
- batches of Silero VAD inference (a real trained model from the ``silero-vad`` wheel) on
  both providers.

Every delivery is verified before it is paid; verified work is paid by cumulative vouchers that
the providers' settlement jobs redeem; beta's late tasks are refunded on chain with the
penalty; both deals are closed. The summary table ends the run (``--json``: one JSON line).

The client side uses only the client SDK and ``contracts``; the market and the providers are
started by module name (``python -m market.cli``, ``python -m provider.cli``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import httpx

from client.accounts import ClientAccount
from client.errors import ClientError
from client.market_http import MarketHttp
from client.provider_http import ProviderHttp
from client.session import DealSession, TaskOutcome, TaskSpec
from client.vouchers import VoucherBook
from contracts.binding import Chain, Escrow
from contracts.chain import Anvil, dev_keys, free_port
from contracts.errors import ChainError
from contracts.messages import (
    KIND_COMPILE,
    KIND_INFERENCE,
    ZERO_ADDRESS,
    Plan,
    Quote,
    address_of,
)
from contracts.orders import Ask, Bid, market_domain, order_id, plan_kind
from contracts.pricing import outcome_based
from contracts.program import ProgramEnvelope

UNIT: Final = 10**6  # one token (6 decimals)
CLIENT_FUNDS: Final = 100 * UNIT  # minted to the client's wallet
CLIENT_DEPOSIT: Final = 10 * UNIT  # deposited into the escrow
PROVIDER_STAKE: Final = 5 * UNIT
DEVICE_CLASS: Final = "cpu"  # what the daemons advertise (they compile for TPU ahead of time)
TPU_TARGET: Final = "v5e:1x1"
CHALLENGE_WINDOW: Final = 3  # seconds: short so the demo's refunds come quickly
DEAL_DURATION: Final = 3_600
START_TIMEOUT_S: Final = 120.0
REDEEM_TIMEOUT_S: Final = 60.0
GIB: Final = 1 << 30

Say = Callable[[str], None]


@dataclass(frozen=True)
class ProviderProfile:
    """One demo provider: its plan, SLO, ask and deal terms."""

    name: str
    plan: Plan
    slo_ms: int
    ask_price: int  # per unit (a unit is one task's worth of budget)
    ask_quantity: int
    penalty: int
    stake: int
    note: str


ALPHA: Final = ProviderProfile(
    name="alpha",
    plan=outcome_based(compile_price=20_000, inference_price=4_000),
    slo_ms=120_000,
    ask_price=10_000,
    ask_quantity=8,
    penalty=50_000,
    stake=1 * UNIT,
    note="dearer, SLO 120 s",
)
BETA: Final = ProviderProfile(
    name="beta",
    plan=outcome_based(compile_price=10_000, inference_price=2_000),
    slo_ms=1_000,
    ask_price=5_000,
    ask_quantity=6,
    penalty=50_000,
    stake=1 * UNIT,
    note="cheaper, promises 1 s on one worker: too slow",
)
BID_PRICE: Final = 10_000
BID_SLO_MS: Final = 120_000


@dataclass(frozen=True)
class Summary:
    """The figures the demo ends with (the keys of its JSON line)."""

    tasks_run: int
    tasks_paid: int
    tasks_refunded: int
    failures_diagnosed: int
    total_spent: int
    gas_per_paid_task: int

    def to_json(self) -> dict[str, int]:
        """Return the JSON line's object: exactly the six figures."""
        return {
            "tasks_run": self.tasks_run,
            "tasks_paid": self.tasks_paid,
            "tasks_refunded": self.tasks_refunded,
            "failures_diagnosed": self.failures_diagnosed,
            "total_spent": self.total_spent,
            "gas_per_paid_task": self.gas_per_paid_task,
        }


@dataclass
class _Task:
    """A workload item: what it is, for the table, and where it goes."""

    provider: str
    label: str
    spec: TaskSpec
    describe: Callable[[bytes], str] | None = None  # what verified outputs say, for the table


@dataclass
class _Deal:
    """One matched, opened deal and its session."""

    profile: ProviderProfile
    provider_key: str
    market_id: str
    chain_id: int
    quote: Quote
    session: DealSession
    outcomes: list[TaskOutcome] = field(default_factory=list)
    tasks: dict[int, _Task] = field(default_factory=dict)  # by id() of the task's spec

    def task_of(self, outcome: TaskOutcome) -> _Task | None:
        """Return the workload item an outcome ran (indices follow submission order)."""
        return self.tasks.get(id(outcome.spec))


# ---- processes ----------------------------------------------------------------------------


class Processes:
    """Subprocesses started by the demo; `stop_all` stops each by PID, newest first."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self._running: list[tuple[str, subprocess.Popen[bytes]]] = []

    def start(self, name: str, args: Sequence[str], env: dict[str, str] | None = None) -> Path:
        """Start ``python -m ...`` (``args``) with its output in ``<log_dir>/<name>.log``."""
        log_path = self.log_dir / f"{name}.log"
        with log_path.open("wb") as log:
            process = subprocess.Popen(
                [sys.executable, *args],
                stdout=log,
                stderr=subprocess.STDOUT,
                env={**os.environ, **(env or {})},
                start_new_session=True,  # Ctrl-C reaches the demo only; it stops them itself
            )
        self._running.append((name, process))
        return log_path

    def check(self, name: str) -> None:
        """Raise if the process ``name`` has exited."""
        for known, process in self._running:
            if known == name and process.poll() is not None:
                tail = (self.log_dir / f"{name}.log").read_text(errors="replace")[-3000:]
                raise DemoError(f"{name} exited with {process.returncode}:\n{tail}")

    def stop_all(self) -> None:
        """SIGTERM each process by PID (SIGKILL after 10 s), newest first."""
        for _, process in reversed(self._running):
            if process.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(process.pid, signal.SIGTERM)
        for _, process in reversed(self._running):
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(process.pid, signal.SIGKILL)
                process.wait()
        self._running.clear()


class DemoError(RuntimeError):
    """The demo could not run to its end (a process died, a step timed out)."""


def _wait_http(url: str, processes: Processes, name: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        processes.check(name)
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url, timeout=2).status_code == 200:
                return
        if time.monotonic() > deadline:
            raise DemoError(f"{name} did not answer {url} within {timeout_s:.0f} s")
        time.sleep(0.2)  # readiness poll of an external process


def _start_market(
    processes: Processes, work: Path, rpc_url: str, escrow: str, chain_id: int
) -> str:
    port = free_port()
    flags = {
        "--port": str(port),
        "--data-dir": str(work / "market"),
        "--rpc-url": rpc_url,
        "--escrow": escrow,
        "--chain-id": str(chain_id),
    }
    processes.start(
        "market",
        ["-m", "market.cli", "market", "serve", *(x for pair in flags.items() for x in pair)],
        env={"DATABASE_URL": ""},  # SQLite in the data dir
    )
    return f"http://127.0.0.1:{port}"


def _provider_config(
    profile: ProviderProfile, work: Path, rpc_url: str, escrow: str, market_url: str
) -> tuple[Path, str]:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    plan = "\n".join(f"{k} = {_toml(v)}" for k, v in profile.plan.to_json().items())
    text = f"""# provider {profile.name}: {profile.note}
rpc_url = "{rpc_url}"
escrow = "{escrow}"
data_dir = "{work / profile.name}"
market_url = "{market_url}"
public_url = "{url}"
host = "127.0.0.1"
port = {port}
pool_size = 1
slo_ms = {profile.slo_ms}
jax_platforms = "cpu"
benchmark_on_start = false
heartbeat_interval_s = 5
log_level = "WARNING"

[plan]
{plan}

[settlement]
redeem_threshold = 1
redeem_max_age_s = 1
silent_after_s = 86400
interval_s = 1
"""
    path = work / f"{profile.name}.toml"
    path.write_text(text)
    return path, url


def _toml(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


# ---- market orders ------------------------------------------------------------------------


def _post_ask(
    market: MarketHttp,
    escrow: Escrow,
    profile: ProviderProfile,
    provider_key: str,
    arbiter: str,
    nonce: int,
) -> str:
    """As the provider's operator: sign a quote and an ask that binds it; post the ask."""
    expiry = int(time.time()) + 1_800
    quote = Quote(
        provider=address_of(provider_key),
        client=ZERO_ADDRESS,
        arbiter=arbiter,
        max_spend=profile.ask_price * profile.ask_quantity,
        stake=profile.stake,
        penalty=profile.penalty,
        duration=DEAL_DURATION,
        challenge_window=CHALLENGE_WINDOW,
        slo_ms=profile.slo_ms,
        valid_until=expiry,
        nonce=nonce,
        plan=profile.plan,
    )
    ask = Ask(
        owner=address_of(provider_key),
        device_class=DEVICE_CLASS,
        quantity=profile.ask_quantity,
        price=profile.ask_price,
        plan=plan_kind(profile.plan),
        slo_ms=profile.slo_ms,
        memory=0,
        expiry=expiry,
        nonce=nonce,
        quote_hash=quote.struct_hash(),
    )
    domain = market_domain(escrow.domain.chain_id, escrow.address)
    market.place_order(
        ask,
        ask.sign(domain, provider_key),
        quote=quote,
        quote_signature=quote.sign(escrow.domain, provider_key),
    )
    return order_id(ask, domain)


# ---- workload ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Workload:
    """The demo's tasks, by provider name."""

    tasks: dict[str, list[_Task]]


def build_workload(say: Say) -> Workload:
    """Export the Silero VAD model and an over-HBM program; return the tasks to run."""
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    from client.models.jax_export import producer_versions
    from client.models.zoo.silero_vad import export_silero_vad, initial_state, speech_like_audio

    started = time.monotonic()
    vad = export_silero_vad(batch=4, chunks=32)
    say(
        f"exported Silero VAD (silero-vad 6.2.3 weights, JAX): program {len(vad.program):,} B, "
        f"weights {len(vad.weights or b''):,} B, symbolic batch "
        f"({time.monotonic() - started:.1f} s)"
    )

    def speech(outputs: bytes) -> str:
        try:
            probabilities = vad.decode_outputs(outputs)[0]
        except ClientError as exc:
            return f"outputs undecodable: {exc}"
        return f"speech in {float((probabilities > 0.5).mean()):.0%} of the 32 ms chunks"

    def vad_task(provider: str, clips: int, seed: int, plan: Plan) -> _Task:
        audio = speech_like_audio(clips, 32, seed)
        state, context = initial_state(clips)
        return _Task(
            provider,
            f"Silero VAD, {clips} clip{'s' if clips > 1 else ''} x 1 s",
            TaskSpec(KIND_INFERENCE, vad.envelope(audio, state, context), plan.inference_price),
            speech,
        )

    oom = _over_hbm_envelope(producer_versions)
    alpha: list[_Task] = [
        _Task(
            "alpha",
            f"compile Silero VAD for {TPU_TARGET}",
            TaskSpec(KIND_COMPILE, vad.compile_envelope(), ALPHA.plan.compile_price, TPU_TARGET),
        ),
        _Task(
            "alpha",
            f"compile dense 60000x60000 f32 for {TPU_TARGET}",
            TaskSpec(KIND_COMPILE, oom, ALPHA.plan.compile_price, TPU_TARGET),
        ),
    ]
    alpha += [vad_task("alpha", 4, seed, ALPHA.plan) for seed in range(1, 5)]
    beta = [vad_task("beta", clips, 10 + clips, BETA.plan) for clips in (1, 2, 3)]
    return Workload(tasks={"alpha": alpha, "beta": beta})


def _over_hbm_envelope(producer_versions: Callable[[int], Any]) -> ProgramEnvelope:
    """Return a program whose 13.4 GiB argument and result do not fit a v5e's 16 GiB HBM."""
    import jax
    import jax.numpy as jnp
    from jax import export

    def double(w: jax.Array) -> jax.Array:
        return w * 2

    weights = jax.ShapeDtypeStruct((60_000, 60_000), jnp.float32)  # type: ignore[no-untyped-call]
    exported = export.export(jax.jit(double), platforms=("tpu",))(weights)
    return ProgramEnvelope.create(
        program=bytes(exported.serialize()),
        inputs=b"",
        producer=producer_versions(exported.calling_convention_version),
        platforms=tuple(exported.platforms),
    )


# ---- the run --------------------------------------------------------------------------------


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
    chain = Chain(rpc_url)
    deployment = chain.deploy(deployer)
    escrow, token = chain.escrow(deployment.escrow), chain.token(deployment.token)
    chain_id = escrow.domain.chain_id
    say(f"chain     {rpc_url} (chain id {chain_id})")
    say(f"token     {deployment.token}")
    say(f"escrow    {deployment.escrow}")
    for key in (alpha_key, beta_key):  # the providers' operators stake before serving
        token.mint(deployer, address_of(key), PROVIDER_STAKE)
        token.approve(key, escrow.address, PROVIDER_STAKE)
        escrow.stake(key, PROVIDER_STAKE)

    market_url = _start_market(processes, work, rpc_url, escrow.address, chain_id)
    provider_urls: dict[str, str] = {}
    for profile, key in ((ALPHA, alpha_key), (BETA, beta_key)):
        config, url = _provider_config(profile, work, rpc_url, escrow.address, market_url)
        processes.start(
            profile.name,
            ["-m", "provider.cli", "run", "--config", str(config)],
            env={
                "TPUMARKET_PROVIDER_PRIVATE_KEY": key,
                "JAX_PLATFORMS": "cpu",
            },
        )
        provider_urls[profile.name] = url
    # Export the models while the daemons start their workers.
    workload = build_workload(say)
    _wait_http(market_url + "/healthz", processes, "market", START_TIMEOUT_S)
    say(f"market    {market_url}   <- web order book (open it in a browser)")
    for name, url in provider_urls.items():
        _wait_http(url + "/v1/health", processes, name, START_TIMEOUT_S)
        profile = ALPHA if name == "alpha" else BETA
        say(f"provider  {name:<6}{url}  {profile.note}")

    market = MarketHttp(market_url)
    arbiter = address_of(arbiter_key)
    for nonce, (profile, key) in enumerate(((ALPHA, alpha_key), (BETA, beta_key)), start=1):
        _post_ask(market, escrow, profile, key, arbiter, nonce)
        say(
            f"ask       {profile.name}: {profile.ask_quantity} units "
            f"at {_tokens(profile.ask_price)}"
            f" ({plan_kind(profile.plan)} plan: compile {_tokens(profile.plan.compile_price)},"
            f" inference {_tokens(profile.plan.inference_price)}; SLO {profile.slo_ms} ms)"
        )

    client = address_of(client_key)
    token.mint(deployer, client, CLIENT_FUNDS)
    account = ClientAccount(escrow, token, client_key, spending_cap=CLIENT_DEPOSIT)
    account.deposit(CLIENT_DEPOSIT)
    say(f"client    {client}: deposited {_tokens(CLIENT_DEPOSIT)} (cap {_tokens(CLIENT_DEPOSIT)})")
    deals = _bid_and_open(market, escrow, account, client_key, keys, provider_urls, say)

    _run_workload(deals, workload, say)
    paid_vouchers = {d.profile.name: d.session.pay() for d in deals}
    for deal in deals:
        voucher = paid_vouchers[deal.profile.name]
        if voucher is not None:
            say(
                f"voucher   deal {deal.chain_id} ({deal.profile.name}): "
                f"{_tokens(voucher.cumulative_amount)} for "
                f"{sum(voucher.covers(o.index) for o in deal.outcomes)} verified tasks, "
                "handed to the provider"
            )
    _wait_for_redemption(escrow, deals, paid_vouchers, say)
    _refund_late(deals, say)
    escrow.tx.reset_nonces()  # the providers' daemons sent transactions with their keys
    for deal in deals:
        account.close(deal.chain_id)
        closed = escrow.close_deal(deal.provider_key, deal.chain_id).event("DealClosed").args
        say(
            f"closed    deal {deal.chain_id} ({deal.profile.name}): "
            f"{_tokens(int(closed['returnedToClient']))} back to the client, "
            f"stake {_tokens(int(closed['stakeReturned']))} back to the provider"
        )
    free = escrow.balance_of(client)
    account.withdraw(free)
    summary, rows = _summarize(escrow, deals)
    _print_table(rows, say)
    say("")
    say(f"  tasks run            {summary.tasks_run}")
    say(f"  paid                 {summary.tasks_paid}")
    say(f"  refunded (late)      {summary.tasks_refunded}")
    say(f"  diagnosed failures   {summary.failures_diagnosed}")
    say(f"  total spent          {_tokens(summary.total_spent)} ({summary.total_spent:,} units)")
    say(f"  gas per paid task    {summary.gas_per_paid_task:,} (voucher redemption)")
    say(f"  client wallet        {_tokens(token.balance_of(client))} after withdrawing")
    say(f"  wall time            {time.monotonic() - started:.0f} s")
    if options.keep_running:
        say(f"order book: {market_url} (up until Ctrl-C)")
    market.close()
    return summary


def _bid_and_open(
    market: MarketHttp,
    escrow: Escrow,
    account: ClientAccount,
    client_key: str,
    keys: list[str],
    provider_urls: dict[str, str],
    say: Say,
) -> list[_Deal]:
    """Bid for both asks' units, wait for the match, open each deal with its quote."""
    domain = market_domain(escrow.domain.chain_id, escrow.address)
    quantity = ALPHA.ask_quantity + BETA.ask_quantity
    bid = Bid(
        owner=account.address,
        device_class=DEVICE_CLASS,
        quantity=quantity,
        price=BID_PRICE,
        plan=plan_kind(ALPHA.plan),
        slo_ms=BID_SLO_MS,
        memory=0,
        expiry=int(time.time()) + 1_800,
        nonce=1,
    )
    market.place_bid(bid, domain, client_key)
    bid_id = order_id(bid, domain)
    say(f"bid       {quantity} units at up to {_tokens(BID_PRICE)}, SLO up to {BID_SLO_MS} ms")
    records = market.wait_for_deals(account.address, bid_id)
    by_address = {address_of(k).lower(): (p, k) for p, k in ((ALPHA, keys[2]), (BETA, keys[3]))}
    adverts = {p["address"].lower(): p for p in market.providers()}
    deals = []
    for record in sorted(records, key=lambda r: str(r["deal_id"])):
        known = by_address.get(str(record["provider"]).lower())
        if known is None:
            raise DemoError(f"deal {record['deal_id']} names an unknown provider")
        profile, provider_key = known
        quote = Quote.from_json(record["quote"])
        signature = bytes.fromhex(str(record["quote_signature"]).removeprefix("0x"))
        max_spend = int(record["max_spend"])
        chain_deal = account.open_deal(quote, signature, max_spend)
        advert = adverts.get(quote.provider.lower())
        endpoint = str(advert["endpoint"]) if advert else provider_urls[profile.name]
        say(
            f"match     {record['deal_id']}: {record['quantity']} units from {profile.name} "
            f"at {_tokens(int(record['price']))} -> deal {chain_deal} opened on chain "
            f"(cap {_tokens(max_spend)}), tasks go to {endpoint}"
        )
        session = DealSession(
            provider=ProviderHttp(endpoint),
            account=account,
            domain=escrow.domain,
            deal_id=chain_deal,
            plan=quote.plan,
            provider_address=quote.provider,
            book=VoucherBook(deal_id=chain_deal, cap=max_spend, on_warning=say),
            challenge_window=quote.challenge_window,
            spot_check_fraction=0.5,
        )
        deals.append(
            _Deal(profile, provider_key, str(record["deal_id"]), chain_deal, quote, session)
        )
    if {d.profile.name for d in deals} != {"alpha", "beta"}:
        raise DemoError(f"expected a deal with each provider, got {[d.market_id for d in deals]}")
    return deals


def _run_workload(deals: list[_Deal], workload: Workload, say: Say) -> None:
    """Run each deal's tasks (both deals at once), verifying every delivery."""

    def progress(deal: _Deal) -> Callable[[TaskOutcome], None]:
        def done(outcome: TaskOutcome) -> None:
            line = _outcome_line(outcome, deal.task_of(outcome))
            say(f"task      {deal.profile.name} #{outcome.index}: {line}")

        return done

    def one(deal: _Deal) -> None:
        tasks = workload.tasks[deal.profile.name]
        deal.tasks = {id(task.spec): task for task in tasks}
        concurrency = 3 if deal.profile is BETA else 2
        deal.outcomes = deal.session.run(
            [t.spec for t in tasks], concurrency=concurrency, wait_s=60, on_done=progress(deal)
        )

    with ThreadPoolExecutor(max_workers=len(deals)) as pool:
        for future in [pool.submit(one, d) for d in deals]:
            future.result()


def _outcome_line(outcome: TaskOutcome, task: _Task | None) -> str:
    view = outcome.view
    if view is None or view.receipt is None:
        return "not delivered"
    if outcome.rejected:
        return f"not paid: {_late_or_reason(outcome)}"
    failure = _delivered_json(outcome) if view.diagnosis else None
    if failure is not None:
        return f"failed, diagnosed {failure.get('category')}: {_diagnosis_line(failure)}"
    return f"verified, {_tokens(view.receipt.amount)}: {_success_detail(outcome, task)}"


def _delivered_json(outcome: TaskOutcome) -> dict[str, Any] | None:
    """Return a compile report or a diagnosis from the delivered (hash-verified) bytes."""
    view = outcome.view
    if view is None or not view.outputs or not (view.diagnosis or view.report):
        return None
    try:
        data = json.loads(view.outputs)
    except ValueError:
        return None
    return data if isinstance(data, dict) else None


def _success_detail(outcome: TaskOutcome, task: _Task | None) -> str:
    report = _delivered_json(outcome)
    if report is not None and report.get("memory_total_bytes") is not None:
        return (
            f"fits: {_size(int(report['memory_total_bytes']))} of "
            f"{_size(int(report.get('available_bytes') or 0))} HBM "
            f"({report.get('device_kind')}, compiled in {float(report['compile_time_s']):.1f} s)"
        )
    said = ""
    if task is not None and task.describe is not None and outcome.view and outcome.view.outputs:
        said = task.describe(outcome.view.outputs) + "; "
    return said + ("outputs spot-checked on CPU" if outcome.spot_checked else "receipt verified")


def _late_or_reason(outcome: TaskOutcome) -> str:
    view = outcome.view
    if outcome.ack is not None and view is not None and view.receipt is not None:
        late = view.receipt.finished_at - outcome.ack.deadline
        if late > 0:
            return f"delivered {late} s after its deadline"
    return outcome.rejected or "no delivery"


def _wait_for_redemption(
    escrow: Escrow, deals: list[_Deal], vouchers: dict[str, Any], say: Say
) -> None:
    """Wait until each provider's settlement job has redeemed its latest voucher."""
    deadline = time.monotonic() + REDEEM_TIMEOUT_S
    for deal in deals:
        voucher = vouchers.get(deal.profile.name)
        if voucher is None:
            continue
        while escrow.get_deal(deal.chain_id).vouched < voucher.cumulative_amount:
            if time.monotonic() > deadline:
                raise DemoError(f"{deal.profile.name} did not redeem its voucher in time")
            time.sleep(0.5)  # the provider's job redeems on its own schedule
        say(f"redeemed  deal {deal.chain_id} ({deal.profile.name}) by the provider's job")


def _refund_late(deals: list[_Deal], say: Say) -> None:
    """Refund, with the penalty, every acked task not verified by its deadline (+ window)."""
    candidates = [
        (deal, o) for deal in deals for o in deal.outcomes if o.ack is not None and not o.verified
    ]
    if not candidates:
        return
    due = max(o.ack.deadline for _, o in candidates if o.ack) + CHALLENGE_WINDOW + 1
    wait = due - time.time()
    if wait > 0:
        say(f"waiting   {wait:.0f} s for the challenge window after the missed deadlines")
        time.sleep(wait)  # the chain's clock follows the wall clock
    for deal in deals:
        for outcome in deal.session.refund_breaches(int(time.time())):
            refund, penalty = outcome.refunded or (0, 0)
            say(
                f"refunded  {deal.profile.name} #{outcome.index}: {_tokens(refund)} back + "
                f"penalty {_tokens(penalty)} from the provider's stake"
            )


# ---- summary ----------------------------------------------------------------------------


def _summarize(escrow: Escrow, deals: list[_Deal]) -> tuple[Summary, list[list[str]]]:
    rows: list[list[str]] = []
    run = paid = refunded = diagnosed = 0
    for deal in deals:
        for outcome in deal.outcomes:
            run += 1
            view = outcome.view
            amount = view.receipt.amount if view and view.receipt else 0
            failure = _delivered_json(outcome) if view is not None and view.diagnosis else None
            if outcome.refunded is not None:
                refunded += 1
                refund, penalty = outcome.refunded
                state, money = "refunded", "0"
                detail = (
                    f"{_late_or_reason(outcome)}; refund {_tokens(refund)} "
                    f"+ penalty {_tokens(penalty)}"
                )
            elif outcome.verified and failure is not None:
                diagnosed += 1
                state, money = f"failed: {failure.get('category')}", _tokens(amount)
                detail = _diagnosis_line(failure)
            elif outcome.verified:
                paid += 1
                state, money = "paid", _tokens(amount)
                detail = _success_detail(outcome, deal.task_of(outcome))
            else:
                state, money, detail = "unsettled", "0", _late_or_reason(outcome)
            rows.append(
                [
                    deal.profile.name,
                    str(outcome.index),
                    task.label if (task := deal.task_of(outcome)) else "?",
                    state,
                    money,
                    detail,
                ]
            )
    total_spent = sum(escrow.get_deal(d.chain_id).vouched for d in deals)
    gas = _settlement_gas(escrow, [d.chain_id for d in deals])
    summary = Summary(
        tasks_run=run,
        tasks_paid=paid,
        tasks_refunded=refunded,
        failures_diagnosed=diagnosed,
        total_spent=total_spent,
        gas_per_paid_task=gas // paid if paid else 0,
    )
    return summary, rows


def _diagnosis_line(diagnosis: dict[str, Any]) -> str:
    parts = [str(diagnosis.get("message") or "")[:80]]
    required, available = diagnosis.get("required_bytes"), diagnosis.get("available_bytes")
    if required is not None and available is not None:
        parts = [f"needs {_size(int(required))}, {_size(int(available))} available"]
    hints = diagnosis.get("hints") or []
    if hints:
        parts.append(f"hint: {hints[0]}")
    return "; ".join(p for p in parts if p)


def _settlement_gas(escrow: Escrow, deal_ids: list[int]) -> int:
    """Return the gas of every transaction that paid tasks (redeemed vouchers, claims)."""
    w3 = escrow.tx.w3
    logs = w3.eth.get_logs({"address": escrow.address, "fromBlock": 0, "toBlock": "latest"})
    paying = {"VoucherRedeemed", "ReceiptsClaimed", "ClaimFinalized"}
    hashes: set[str] = set()
    for log in logs:
        for event in escrow.decode_events([log]):
            if event.name in paying and int(event.args["dealId"]) in deal_ids:
                hashes.add("0x" + bytes(log["transactionHash"]).hex())
    gas = 0
    for tx_hash in sorted(hashes):
        receipt: Any = w3.eth.get_transaction_receipt(tx_hash)  # type: ignore[arg-type]
        gas += int(receipt["gasUsed"])
    return gas


def _print_table(rows: list[list[str]], say: Say) -> None:
    header = ["provider", "task", "what", "outcome", "paid", "detail"]
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header) - 1)]
    say("")
    for row in [header, *rows]:
        cells = [c.ljust(w) for c, w in zip(row[:-1], widths, strict=True)]
        say("  " + "  ".join([*cells, row[-1]]))


def _tokens(amount: int) -> str:
    return f"{amount / UNIT:.4f}"


def _size(size: int) -> str:
    if size >= GIB:
        return f"{size / GIB:.2f} GiB"
    return f"{size / (1 << 20):.1f} MiB"


# ---- command line ------------------------------------------------------------------------


def _add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="end with one JSON line of figures")
    parser.add_argument(
        "--keep-running",
        action="store_true",
        help="keep the chain, market and providers up after the summary, until Ctrl-C",
    )
    parser.add_argument(
        "--rpc-url",
        default=None,
        help="use this anvil (dev mnemonic) instead of starting one; contracts are deployed",
    )
    parser.add_argument(
        "--work-dir", type=Path, default=None, help="keep data dirs and logs here (default: temp)"
    )


def register(commands: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add `tpumarket demo`."""
    demo = commands.add_parser("demo", help="run the whole market end to end on a local chain")
    _add_arguments(demo)
    demo.set_defaults(handler=_handle)


def _handle(args: argparse.Namespace) -> int:
    options = DemoOptions(
        json=args.json, keep_running=args.keep_running, rpc_url=args.rpc_url, work_dir=args.work_dir
    )

    def say(line: str) -> None:
        print(line, flush=True)

    def report(summary: Summary) -> None:
        if options.json:
            print(json.dumps(summary.to_json()), flush=True)

    try:
        run(options, say, report)
    except (DemoError, ChainError, ClientError) as exc:
        print(f"error: {exc}", file=sys.stderr, flush=True)
        return 1
    except KeyboardInterrupt:
        print("interrupted: everything the demo started is stopped", file=sys.stderr)
        return 130
    return 0


def main(argv: list[str] | None = None) -> int:
    """Run the demo without the `tpumarket` entry point: `python -m client.demo`."""
    parser = argparse.ArgumentParser(prog="tpumarket demo", description=__doc__.splitlines()[0])
    _add_arguments(parser)
    return _handle(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
