"""`job run` exits non-zero whenever work it was asked to do is left undone, and says how to
finish it.

Real anvil, a real daemon, the client as `python -m client.cli job run` (a subprocess):

- the provider goes down mid-run: the tasks not yet acked end "unknown"; the run exits 1 naming
  them and saying to rerun the same command, and the rerun (provider back) finishes them, each
  input paid once;
- the provider takes tasks but refuses every voucher (an HTTP proxy in front of it answers 503
  to `POST /v1/vouchers`): the run exits 1, its `pending_payment` names the tasks the voucher
  was meant to pay, and `job status --fetch` later hands the kept voucher over;
- a run that pays its tasks lists none of them in `pending_payment` and exits 0.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

from contracts.binding import TASK_VOUCHED
from contracts.messages import Plan
from tests.client.jobs_support import (
    STEPS_SLOW,
    JobFiles,
    JobProcess,
    job,
    run_args,
    wait_ledger,
    write_files,
)
from tests.e2e.stack import UNIT, Provider, Stack, stack
from tests.polling import wait_until

PLAN = Plan(compile_price=2_000, inference_price=1_000)


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Stack, JobFiles]]:
    with stack(tmp_path_factory.mktemp("undone"), lean=True) as built:
        built.escrow.deposit(built.client, 10 * UNIT)
        steps = {"slow0": STEPS_SLOW, "fast0": 1_000, "fast1": 1_000, "fast2": 1_000}
        yield built, write_files(tmp_path_factory.mktemp("inputs"), steps)


class VoucherRefusingProxy:
    """An HTTP proxy to a daemon that answers 503 to every voucher and passes the rest."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream
        self.refused = 0
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            def _forward(self, method: str) -> None:
                length = int(self.headers.get("Content-Length", "0"))
                body = self.rfile.read(length) if length else b""
                if method == "POST" and self.path.startswith("/v1/vouchers"):
                    proxy.refused += 1
                    self._answer(503, b'{"error":"Unavailable","reason":"vouchers refused"}')
                    return
                headers = {
                    k: v
                    for k, v in self.headers.items()
                    if k.lower() not in ("host", "content-length", "connection")
                }
                reply = httpx.request(
                    method, proxy.upstream + self.path, content=body, headers=headers, timeout=60
                )
                self._answer(reply.status_code, reply.content, reply.headers.get("content-type"))

            def _answer(self, status: int, body: bytes, kind: str | None = None) -> None:
                self.send_response(status)
                self.send_header("Content-Type", kind or "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self) -> None:
                self._forward("GET")

            def do_POST(self) -> None:
                self._forward("POST")

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _deal(st: Stack, provider: Provider, window: int = 10) -> int:
    return st.open_deal(st.quote(provider, max_spend=100_000, window=window), provider)


def test_job_run_with_the_provider_down_exits_1_naming_the_undone_tasks_and_a_rerun_finishes(
    world: tuple[Stack, JobFiles], tmp_path: Path
) -> None:
    st, files = world
    # A 3 s SLO: a task the daemon cannot take is given up within seconds.
    provider = st.start_provider("down", PLAN, slo_ms=3_000)
    deal_id = _deal(st, provider)
    args = run_args(deal_id, provider, files, "slow0", "fast0", "fast1")
    run = JobProcess(st, tmp_path, *args, "--concurrency", "1")
    try:
        wait_ledger(
            st,
            tmp_path,
            deal_id,
            lambda tasks: any(t.ack is not None for t in tasks.values()),
            "the first ack",
            client=run,
        )
        provider.process.kill9()  # down for good while this run lasts
        result, stderr = run.finish(expect=1)
    finally:
        run.stop()
    states = {t["task"].rsplit(" ", 1)[-1]: t["state"] for t in result["tasks"]}
    assert states["fast0.safetensors"] == states["fast1.safetensors"] == "unknown", states
    undone = result["summary"]["tasks_undone"]
    assert len(undone) == 2 and all("fast" in label for label in undone)
    [line] = [x for x in stderr.splitlines() if "left undone" in x]
    assert line.startswith("error: 2 task(s) left undone: ")
    assert "fast0.safetensors" in line and "fast1.safetensors" in line
    assert "rerun the same command" in line

    provider.restart()
    again, stderr = job(st, tmp_path, *args)  # exit 0: nothing left undone
    assert "left undone" not in stderr
    again_states = {t["task"].rsplit(" ", 1)[-1]: t["state"] for t in again["tasks"]}
    assert again_states["fast0.safetensors"] == again_states["fast1.safetensors"] == "paid"
    # The acked task is always resumed; the two the provider never acked are resumed if the
    # first run had signed them before it gave up (timing), else sent afresh: either way once.
    assert 1 <= again["summary"]["tasks_resumed"] <= 3 and again["summary"]["tasks_undone"] == []
    wait_until(
        lambda: st.escrow.get_deal(deal_id).vouched == again["summary"]["voucher_total"],
        60,
        "the voucher redeemed",
    )
    paid = [i for i in range(8) if st.escrow.task_status(deal_id, i) == TASK_VOUCHED]
    assert len(paid) == sum(s == "paid" for s in again_states.values())  # each input once


def test_a_voucher_the_provider_refuses_exits_1_and_status_fetch_hands_it_over_later(
    world: tuple[Stack, JobFiles], tmp_path: Path
) -> None:
    st, files = world
    provider = st.start_provider("refusing", PLAN, slo_ms=20_000)
    deal_id = _deal(st, provider, window=60)  # the daemon would claim only 50 s from now
    proxy = VoucherRefusingProxy(provider.url)
    try:
        args = run_args(deal_id, provider, files, "fast0", "fast1")
        args[args.index(provider.url)] = proxy.url
        result, stderr = job(st, tmp_path, *args, expect=1)
    finally:
        proxy.close()
    assert proxy.refused >= 1
    summary = result["summary"]
    assert [t["state"] for t in result["tasks"]] == ["paid", "paid"]  # verified: owed
    assert summary["voucher_error"] and "voucher" in summary["settlement_errors"][0]
    assert summary["pending_payment"] == [0, 1]  # the voucher did not reach the provider
    assert "error: settlement incomplete (voucher: " in stderr
    assert st.escrow.get_deal(deal_id).vouched == 0

    common = ["--deal", str(deal_id), "--provider-url", provider.url]
    status, _ = job(st, tmp_path, "status", *common, "--fetch", str(tmp_path / "out"))
    assert status["last_voucher"] == 2 * PLAN.inference_price
    wait_until(
        lambda: st.escrow.get_deal(deal_id).vouched == 2 * PLAN.inference_price,
        60,
        "the kept voucher redeemed",
    )


def test_a_run_that_pays_its_tasks_lists_none_pending_and_exits_0(
    world: tuple[Stack, JobFiles], tmp_path: Path
) -> None:
    st, files = world
    provider = st.start_provider("paying", PLAN, slo_ms=20_000)
    deal_id = _deal(st, provider)
    result, stderr = job(st, tmp_path, *run_args(deal_id, provider, files, "fast0", "fast2"))
    summary = result["summary"]
    assert [t["state"] for t in result["tasks"]] == ["paid", "paid"]
    assert summary["voucher_signed"] is True and summary["voucher_error"] is None
    assert summary["pending_payment"] == [] and summary["tasks_undone"] == []
    assert "error" not in stderr
