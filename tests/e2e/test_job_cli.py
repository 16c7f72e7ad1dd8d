"""`tpumarket job` end to end: market match, deal, batches of tasks, vouchers, refunds, close.

One anvil, one market and two provider daemons (all real processes) serve the module; the
client bids and opens deals with the SDK and runs its tasks with the `tpumarket job` CLI as a
subprocess. Balances are checked to the unit after every settlement.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from client.accounts import ClientAccount, open_market_deal
from client.market_http import MarketHttp
from client.provider_http import ProviderHttp
from contracts.binding import DEAL_CLOSED, TASK_NONE, TASK_REFUNDED, TASK_VOUCHED
from contracts.errors import ContractRevert
from contracts.messages import ZERO_ADDRESS, Claim, address_of
from contracts.pricing import outcome_based
from programs.envelope import encode_arrays, encode_envelope
from tests import processes
from tests.client.jobs_support import acked_by_provider, ledger_of
from tests.e2e.stack import (
    MIN_WINDOW,
    PROVIDER_STAKE,
    ROOT,
    SLOW_STEPS,
    UNIT,
    Provider,
    Stack,
    bid,
    post_ask,
    spin_inputs,
    spin_model,
    stack,
    wait_until,
)
from tests.rpc_proxy import RpcProxy

DEPOSIT = 2 * UNIT
FAST_PLAN = outcome_based(compile_price=20_000, inference_price=4_000)
SLOW_PLAN = outcome_based(compile_price=10_000, inference_price=2_000)
PENALTY = 50_000
# ~6 s of device time: past the slow provider's deadline (its 1 s SLO + 2 s of slack).
LATE_STEPS = 2 * SLOW_STEPS


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Stack, Provider, Provider]]:
    work = tmp_path_factory.mktemp("job-cli")
    with stack(work, market=True, lean=True) as built:
        fast = built.start_provider("fast", FAST_PLAN, slo_ms=60_000)
        slow = built.start_provider("slow", SLOW_PLAN, slo_ms=1_000)
        built.escrow.deposit(built.client, DEPOSIT)
        yield built, fast, slow


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A program file and inputs files, as `tpumarket job export` would leave them."""
    folder = tmp_path_factory.mktemp("job-files")
    model = spin_model()
    out = {"program": folder / "spin.tpmp"}
    out["program"].write_bytes(encode_envelope(model.example_envelope()))
    for name, steps, seed in (("a", 1_000, 1), ("c", 1_000, 3), ("slow1", LATE_STEPS, 4)):
        out[name] = folder / f"{name}.safetensors"
        out[name].write_bytes(encode_arrays(spin_inputs(model, steps, seed)))
    out["b"] = folder / "b.npz"
    np.savez(out["b"], **spin_inputs(model, 1_000, 2))
    out["slow2"] = folder / "slow2.safetensors"
    out["slow2"].write_bytes(encode_arrays(spin_inputs(model, LATE_STEPS, 5)))
    return out


def job(st: Stack, *args: str, state: Path, expect: int | None = 0) -> tuple[dict[str, Any], str]:
    """Run `tpumarket job ...` as the client; return its JSON line and its stderr (its exit
    code must be `expect`, unless that is None)."""
    done = subprocess.run(
        [sys.executable, "-m", "client.cli", "job", *args, "--json"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={
            **os.environ,
            "JAX_PLATFORMS": "cpu",
            "TPUMARKET_RPC_URL": st.rpc_url,
            "TPUMARKET_ESCROW": st.escrow.address,
            "TPUMARKET_CLIENT_KEY": st.client,
            "TPUMARKET_CLIENT_STATE": str(state),
        },
    )
    assert expect is None or done.returncode == expect, done.stdout[-3000:] + done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1]), done.stderr


def test_job_run_pays_verified_tasks_across_runs_within_the_cap_then_the_deal_closes_exactly(
    world: tuple[Stack, Provider, Provider], files: dict[str, Path], tmp_path: Path
) -> None:
    st, fast, _ = world
    terms = st.quote(fast, max_spend=80_000, client=ZERO_ADDRESS)
    post_ask(st, fast, terms, price=10_000, quantity=8)
    _, deals = bid(st, price=10_000, quantity=8, plan="outcome", slo_ms=120_000)
    assert [(d["provider"].lower(), int(d["max_spend"])) for d in deals] == [
        (fast.address.lower(), 80_000)
    ]
    # The ask's quote names nobody; the provider's daemon signs this fill's quote naming the
    # client, with the ask's terms and a fresh nonce, and the client opens the deal with it.
    account = ClientAccount(st.escrow, st.token, st.client, min_challenge_window=MIN_WINDOW)
    assert st.market_url is not None
    market = MarketHttp(st.market_url)
    try:
        opened = open_market_deal(market, account, str(deals[0]["deal_id"]))
    finally:
        market.close()
    assert opened.quote.client == address_of(st.client)
    assert opened.quote.nonce != terms.nonce
    assert (opened.quote.plan, opened.quote.challenge_window) == (
        terms.plan,
        terms.challenge_window,
    )
    deal_id = opened.chain_deal_id
    common = ["--deal", str(deal_id), "--provider-url", fast.url, "--program"]
    common.append(str(files["program"]))

    first, _ = job(
        st, "run", *common, "--compile", "local", "--inputs", str(files["a"]), state=tmp_path
    )
    assert [t["state"] for t in first["tasks"]] == ["paid", "paid"]
    assert first["summary"]["voucher_total"] == 24_000

    # The second run continues the cumulative voucher; its cap leaves room for one task only.
    second, stderr = job(
        st,
        "run",
        *common,
        *("--inputs", str(files["b"]), str(files["c"])),
        *("--cap", "0.028"),
        state=tmp_path,
    )
    assert [t["state"] for t in second["tasks"]] == ["paid", "skipped"]
    assert [t["index"] for t in second["tasks"]] == [2, None]
    assert second["summary"]["voucher_total"] == 28_000 == second["summary"]["cap"]
    assert "projected bill 0.028000 of cap 0.028000" in stderr
    assert "warning: the batch could cost 0.032000, past the cap 0.028000" in stderr

    wait_until(lambda: st.escrow.get_deal(deal_id).vouched == 28_000, 60, "voucher redeemed")
    assert [st.escrow.task_status(deal_id, i) for i in range(4)] == [TASK_VOUCHED] * 3 + [TASK_NONE]
    # The client agrees to close; the provider's settlement job closes the deal.
    account.close(deal_id)
    assert st.escrow.get_deal(deal_id).client_agreed_close
    wait_until(
        lambda: st.escrow.get_deal(deal_id).status == DEAL_CLOSED, 60, "deal closed by provider"
    )

    client = address_of(st.client)
    assert st.escrow.balance_of(client) == DEPOSIT - 28_000
    assert st.escrow.balance_of(fast.address) == 28_000
    assert st.escrow.stake_of(fast.address) == PROVIDER_STAKE
    assert st.escrow_solvent()


def test_job_run_refunds_a_slow_providers_late_tasks_with_the_penalty_and_it_cannot_claim_them(
    world: tuple[Stack, Provider, Provider], files: dict[str, Path], tmp_path: Path
) -> None:
    st, _, slow = world
    client = address_of(st.client)
    free_before = st.escrow.balance_of(client)
    quote = st.quote(slow, max_spend=20_000, penalty=PENALTY)
    deal_id = st.open_deal(quote, slow)

    result, _ = job(
        st,
        "run",
        *("--deal", str(deal_id), "--provider-url", slow.url, "--program", str(files["program"])),
        *("--inputs", str(files["slow1"]), str(files["slow2"]), "--concurrency", "2"),
        "--wait-refunds",
        state=tmp_path,
    )
    assert [t["state"] for t in result["tasks"]] == ["refunded", "refunded"]
    details = [str(t["detail"]) for t in result["tasks"]]
    assert all(f"refund 2000 + penalty {PENALTY}" in d for d in details), details
    summary = result["summary"]
    assert (summary["tasks_refunded"], summary["refunded"], summary["penalties"]) == (
        2,
        2 * 2_000,
        2 * PENALTY,
    )
    assert summary["voucher_total"] == 0 and summary["pending_refunds"] == []
    assert [st.escrow.task_status(deal_id, i) for i in (0, 1)] == [TASK_REFUNDED] * 2
    assert st.escrow.balance_of(client) == free_before - 20_000 + 2 * 2_000 + 2 * PENALTY

    # Its late receipts cannot be claimed, even with the client's signed requests. (Refunded,
    # the tasks are settled: the daemon may have released their outputs, never their receipts.)
    provider = ProviderHttp(slow.url, client_key=st.client)
    wait_until(
        lambda: all(provider.receipt(deal_id, i, wait_s=5) for i in (0, 1)),
        300,
        "both late deliveries",
    )
    receipts = [provider.receipt(deal_id, i) for i in (0, 1)]
    assert all(r is not None and r.finished_at > r.deadline for r in receipts)
    max_price = SLOW_PLAN.inference_price
    claims = [
        Claim(r, max_price, r.request(max_price).sign(st.escrow.domain, st.client))
        for r in receipts
        if r is not None
    ]
    with pytest.raises(ContractRevert):
        st.escrow.claim_receipts(slow.key, deal_id, SLOW_PLAN, claims)
    st.escrow.tx.reset_nonces()
    assert st.escrow.balance_of(slow.address) == 0
    assert st.escrow_solvent()


class _ChainProxy:
    """An HTTP proxy to the chain that stops answering at the first JSON-RPC batch it sees.

    The client's first batch is the settlement's (the voucher reconciles the tasks' states on
    chain in one batch): everything before it passes, everything from it on is cut off.
    """

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream
        self.cut = threading.Event()
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                if body.lstrip().startswith(b"["):
                    proxy.cut.set()
                if proxy.cut.is_set():
                    self.close_connection = True  # no answer: the chain stopped answering
                    return
                reply = httpx.post(
                    proxy.upstream, content=body, headers={"Content-Type": "application/json"}
                )
                self.send_response(reply.status_code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(reply.content)))
                self.end_headers()
                self.wfile.write(reply.content)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_job_run_writes_outputs_and_its_report_when_the_chain_stops_answering_at_settlement(
    world: tuple[Stack, Provider, Provider], files: dict[str, Path], tmp_path: Path
) -> None:
    st, fast, _ = world
    deal_id = st.open_deal(st.quote(fast, max_spend=20_000), fast)
    proxy = _ChainProxy(st.rpc_url)
    out = tmp_path / "results"
    try:
        done = subprocess.run(
            [
                *(sys.executable, "-m", "client.cli", "job", "run", "--json"),
                *("--deal", str(deal_id), "--provider-url", fast.url, "--rpc-url", proxy.url),
                *("--program", str(files["program"]), "--inputs", str(files["a"])),
                *("--out", str(out)),
            ],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=300,
            env={
                **os.environ,
                "JAX_PLATFORMS": "cpu",
                "TPUMARKET_ESCROW": st.escrow.address,
                "TPUMARKET_CLIENT_KEY": st.client,
                "TPUMARKET_CLIENT_STATE": str(tmp_path / "state"),
            },
        )
    finally:
        proxy.close()
    assert proxy.cut.is_set()
    assert done.returncode == 1, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert [t["state"] for t in result["tasks"]] == ["paid"]  # verified: the client owes it
    summary = result["summary"]
    assert summary["voucher_signed"] is False and summary["pending_payment"] == [0]
    assert summary["settlement_errors"][0].startswith("voucher: ")
    assert result["outputs"] == [str(out / "task-0.safetensors")]
    assert (out / "task-0.safetensors").stat().st_size > 0
    err = done.stderr.strip().splitlines()
    assert "Traceback" not in done.stderr
    assert any(line.startswith("pending: tasks 0 are verified and not paid yet") for line in err)
    assert err[-1].startswith("error: settlement incomplete (voucher: ")

    # With the chain back, what was pending is paid from the ledger.
    fetched, _ = job(
        st, "status", "--deal", str(deal_id), "--provider-url", fast.url, "--fetch",
        str(tmp_path / "fetched"), state=tmp_path / "state",
    )  # fmt: skip
    assert fetched["last_voucher"] == 4_000
    wait_until(lambda: st.escrow.get_deal(deal_id).vouched == 4_000, 60, "voucher redeemed")


def test_job_run_says_what_it_waits_for_while_the_provider_does_not_answer(
    world: tuple[Stack, Provider, Provider], files: dict[str, Path], tmp_path: Path
) -> None:
    st, fast, _ = world
    deal_id = st.open_deal(st.quote(fast, max_spend=20_000), fast)
    process = processes.spawn(
        [
            *(sys.executable, "-m", "client.cli", "job", "run", "--json"),
            *("--deal", str(deal_id), "--provider-url", fast.url),
            *("--program", str(files["program"]), "--inputs", str(files["slow1"])),
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={
            **os.environ,
            "JAX_PLATFORMS": "cpu",
            "TPUMARKET_RPC_URL": st.rpc_url,
            "TPUMARKET_ESCROW": st.escrow.address,
            "TPUMARKET_CLIENT_KEY": st.client,
            "TPUMARKET_CLIENT_STATE": str(tmp_path / "state"),
        },
    )
    lines: list[str] = []
    assert process.stderr is not None
    reader = threading.Thread(target=lambda: lines.extend(process.stderr or []), daemon=True)
    reader.start()
    # Once the daemon acked the task (a few seconds of device time), it stops answering.
    wait_until(lambda: acked_by_provider(st, fast, deal_id) == 1, 120, "the task acked")
    fast.process.signal(signal.SIGSTOP)  # its port stays open; nothing answers
    try:
        wait_until(
            lambda: any("provider" in x and "not answering" in x for x in lines),
            120,
            "the client saying the provider does not answer",
        )
    finally:
        fast.process.signal(signal.SIGCONT)
    out, _ = process.communicate(timeout=300)
    reader.join(10)
    said = next(x for x in lines if "not answering" in x)
    assert said.startswith("waiting ") and f"provider {fast.url} not answering" in said
    assert f"chain {st.rpc_url} answering" in said
    assert process.returncode == 0
    assert [t["state"] for t in json.loads(out.strip().splitlines()[-1])["tasks"]] == ["paid"]


class _RefusingSends(RpcProxy):
    """The real node, except that it refuses every transaction sent to it."""

    def intercept(self, body: bytes) -> tuple[int, bytes] | None:
        request = json.loads(body)
        if isinstance(request, dict) and request.get("method") == "eth_sendRawTransaction":
            refused = {"code": -32003, "message": "insufficient funds for gas * price + value"}
            answer = {"jsonrpc": "2.0", "id": request.get("id"), "error": refused}
            return 200, json.dumps(answer).encode()
        return None


def test_a_due_refund_the_chain_does_not_take_exits_1_and_the_next_run_sends_it(
    world: tuple[Stack, Provider, Provider], files: dict[str, Path], tmp_path: Path
) -> None:
    st, _, slow = world
    deal_id = st.open_deal(st.quote(slow, max_spend=20_000, penalty=PENALTY), slow)
    run = ("--deal", str(deal_id), "--provider-url", slow.url, "--program", str(files["program"]))
    job(st, "run", *run, "--inputs", str(files["slow1"]), state=tmp_path, expect=None)
    [task] = ledger_of(st, tmp_path, deal_id).tasks.values()  # acked, delivered late
    deal = st.escrow.get_deal(deal_id)
    due = min(task.request.deadline, deal.expiry) + deal.challenge_window + 1
    st.anvil.increase_time(max(1, due - st.anvil.latest_timestamp()))

    refuse = ("--deal", str(deal_id), "--provider-url", slow.url)
    node = _RefusingSends(st.rpc_url)
    try:
        out, err = job(st, "refund", *refuse, "--rpc-url", node.url, state=tmp_path, expect=1)
    finally:
        node.close()
    assert (out["refunds"], out["pending_refunds"], out["refunds_failed"]) == ([], [0], [0])
    assert f"run `tpumarket job refund --deal {deal_id}` again" in err.splitlines()[-1]
    assert st.escrow.task_status(deal_id, 0) == TASK_NONE

    out, _ = job(st, "refund", *refuse, state=tmp_path)
    assert [r["index"] for r in out["refunds"]] == [0] and out["refunds_failed"] == []
    assert st.escrow.task_status(deal_id, 0) == TASK_REFUNDED
