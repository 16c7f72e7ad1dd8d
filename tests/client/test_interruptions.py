"""P5: interruptions never cost the honest side. Real anvil, real daemons, the real CLI.

The client is killed with SIGKILL, interrupted with one or two SIGINTs, run twice at once on
one deal, and left polling while its provider is killed and restarted; a failed voucher
hand-over is followed by the provider's claim. Every figure is read back from the chain.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from client.accounts import ClientAccount
from client.errors import ProviderRejected
from client.job_cap import fit_under_cap
from client.job_files import inference_tasks, read_envelope
from client.jobs import JobRunner
from client.ledger import DealLedger
from client.ledger_records import ChainState, TaskState
from client.provider_http import ProviderHttp
from client.session import DealSession
from client.tasks import request_deadline
from client.vouchers import VoucherBook
from contracts.binding import TASK_CLAIMED, TASK_VOUCHED
from contracts.messages import Plan
from tests.client.jobs_support import (
    STEPS_SLOW,
    JobFiles,
    JobProcess,
    acked_by_provider,
    delivered_by_provider,
    job,
    ledger_of,
    run_args,
    wait_ledger,
    write_files,
)
from tests.e2e.stack import UNIT, Provider, Stack, stack, wait_until

PLAN = Plan(compile_price=2_000, inference_price=1_000)
DEPOSIT = 10 * UNIT


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Stack, Provider]]:
    with stack(tmp_path_factory.mktemp("interruptions"), lean=True) as built:
        provider = built.start_provider("steady", PLAN, slo_ms=60_000)
        more = 5 * UNIT  # every test opens a deal with it, each locking a stake of UNIT
        built.token.mint(built.deployer, provider.address, more)
        built.token.approve(provider.key, built.escrow.address, more)
        built.escrow.stake(provider.key, more)
        built.escrow.deposit(built.client, DEPOSIT)
        yield built, provider


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> JobFiles:
    steps = {f"slow{i}": STEPS_SLOW for i in range(4)}
    steps.update({f"fast{i}": 1_000 for i in range(4)})
    return write_files(tmp_path_factory.mktemp("inputs"), steps)


def _deal(st: Stack, provider: Provider, max_spend: int = 100_000, window: int = 10) -> int:
    return st.open_deal(st.quote(provider, max_spend=max_spend, window=window), provider)


def _acked(count: int) -> object:
    return lambda tasks: sum(t.ack is not None for t in tasks.values()) >= count


def test_request_deadline_is_now_plus_the_slo_in_whole_seconds_plus_two() -> None:
    assert request_deadline(1_000.9, 30_000) == 1_032
    assert request_deadline(1_000.0, 1_001) == 1_004  # ceil(1.001 s) = 2 s, plus 2 s of slack


def test_rerun_after_kill_resumes_and_does_not_pay_twice(
    world: tuple[Stack, Provider], files: JobFiles, tmp_path: Path
) -> None:
    st, provider = world
    deal_id = _deal(st, provider)
    names = ("slow0", "slow1", "slow2")
    first = JobProcess(st, tmp_path, *run_args(deal_id, provider, files, *names))
    try:
        acked = wait_ledger(
            st, tmp_path, deal_id, _acked(3), "three acks in the ledger", client=first
        )
    finally:
        first.kill9()  # after the acks reached the ledger, before any result
    assert sorted(acked) == [0, 1, 2]
    assert all(t.state == TaskState.ACKED for t in acked.values())

    second, _ = job(st, tmp_path, *run_args(deal_id, provider, files, *names))
    summary = second["summary"]
    assert (summary["tasks_resumed"], summary["tasks_paid"]) == (3, 3), second["tasks"]
    assert [t["index"] for t in second["tasks"]] == [0, 1, 2]  # the same tasks, not new ones
    assert summary["voucher_total"] == 3 * PLAN.inference_price
    assert acked_by_provider(st, provider, deal_id) == 3  # the provider ran each input once
    wait_until(
        lambda: st.escrow.get_deal(deal_id).vouched == 3 * PLAN.inference_price,
        60,
        "the provider redeeming the voucher",
    )
    deal = st.escrow.get_deal(deal_id)
    assert deal.committed == 3 * PLAN.inference_price  # paid once, nothing refunded
    ledger = ledger_of(st, tmp_path, deal_id)
    assert ledger.unfinished_runs() == [] and ledger.next_index == 3


def test_second_run_on_same_deal_refused_by_lock(
    world: tuple[Stack, Provider], files: JobFiles, tmp_path: Path
) -> None:
    st, provider = world
    deal_id = _deal(st, provider)
    held = DealLedger.open(tmp_path, st.escrow.domain.chain_id, st.escrow.address, deal_id)
    try:
        _, stderr = job(st, tmp_path, *run_args(deal_id, provider, files, "fast0"), expect=1)
    finally:
        held.close()
    assert f"error: deal {deal_id} is in use by process" in stderr
    assert "one run per deal at a time" in stderr
    assert acked_by_provider(st, provider, deal_id) == 0  # nothing was sent


def test_first_ctrl_c_stops_sending_collects_what_is_in_flight_and_pays_it(
    world: tuple[Stack, Provider], files: JobFiles, tmp_path: Path
) -> None:
    st, provider = world
    deal_id = _deal(st, provider)
    out = tmp_path / "out"
    args = [*run_args(deal_id, provider, files, "slow0", "slow1", "slow2", "slow3")]
    args += ["--concurrency", "2", "--out", str(out)]
    run = JobProcess(st, tmp_path / "state", *args)
    try:
        wait_ledger(st, tmp_path / "state", deal_id, _acked(2), "two tasks in flight", client=run)
        run.interrupt()
        result, stderr = run.finish()
    finally:
        run.stop()
    assert "interrupted: no more tasks are sent; collecting the 2 in flight" in stderr
    summary = result["summary"]
    assert summary["interrupted"] == 1
    assert [t["state"] for t in result["tasks"]] == ["paid", "paid", "not sent", "not sent"]
    assert summary["voucher_total"] == 2 * PLAN.inference_price
    assert sorted(p.name for p in out.iterdir()) == ["task-0.safetensors", "task-1.safetensors"]
    assert acked_by_provider(st, provider, deal_id) == 2


def test_double_ctrl_c_keeps_acked_tasks_pending_and_a_later_fetch_pays_them_not_refunds(
    world: tuple[Stack, Provider], files: JobFiles, tmp_path: Path
) -> None:
    st, provider = world
    deal_id = _deal(st, provider)
    run = JobProcess(st, tmp_path, *run_args(deal_id, provider, files, "slow0", "slow1"))
    try:
        wait_ledger(st, tmp_path, deal_id, _acked(2), "two acks", client=run)
        run.interrupt()
        run.wait_stderr("interrupted: no more tasks are sent")
        run.interrupt()
        result, stderr = run.finish(expect=130)
    finally:
        run.stop()
    assert result["summary"]["interrupted"] == 2
    # Acks go in index order, one at a time: task 0 may finish between the second ack and the
    # interrupts (timing), and is then collected; what was not is left pending, never decided.
    pending = result["summary"]["pending"]
    assert pending in ([0, 1], [1])
    assert f"stopped: tasks {', '.join(map(str, pending))} acked and not collected" in stderr
    ledger = ledger_of(st, tmp_path, deal_id)
    assert {i: t.state for i, t in ledger.tasks.items()} == {
        i: TaskState.ACKED if i in pending else TaskState.VERIFIED for i in (0, 1)
    }  # not "no delivery": nothing was decided about the pending ones
    assert ledger.unfinished_runs() == [1]

    # Later: the crashed run's tasks, their state on chain, their results fetched and paid.
    wait_until(lambda: delivered_by_provider(st, provider, deal_id) == 2, 120, "deliveries")
    fetched = tmp_path / "fetched"
    status, _ = job(
        st, tmp_path, "status", "--deal", str(deal_id), "--provider-url", provider.url,
        "--fetch", str(fetched),
    )  # fmt: skip
    assert [(t["index"], t["state"], t["chain"]) for t in status["tasks"]] == [
        (0, "verified", "none"),
        (1, "verified", "none"),
    ]
    assert sorted(p.name for p in fetched.iterdir()) == ["task-0.safetensors", "task-1.safetensors"]
    assert status["last_voucher"] == 2 * PLAN.inference_price
    # A refund pass after every settlement instant refunds nothing: the work was delivered.
    ledger = ledger_of(st, tmp_path, deal_id)
    deal = st.escrow.get_deal(deal_id)
    due = max(min(t.request.deadline, deal.expiry) for t in ledger.tasks.values())
    st.anvil.increase_time(due + deal.challenge_window + 1 - st.anvil.latest_timestamp())
    refund, _ = job(st, tmp_path, "refund", "--deal", str(deal_id), "--provider-url", provider.url)
    assert refund["refunds"] == [] and refund["pending_refunds"] == []
    assert st.escrow.get_deal(deal_id).stake == UNIT  # the honest provider lost no penalty


def test_client_keeps_polling_through_a_provider_restart_and_pays_the_on_time_delivery(
    world: tuple[Stack, Provider], files: JobFiles, tmp_path: Path
) -> None:
    st, _ = world
    flaky = st.start_provider("flaky", PLAN, slo_ms=60_000)
    deal_id = _deal(st, flaky)
    run = JobProcess(st, tmp_path, *run_args(deal_id, flaky, files, "slow0"))
    try:
        wait_ledger(st, tmp_path, deal_id, _acked(1), "the ack", client=run)
        flaky.process.kill9()  # connections refused from now on
        flaky.restart()  # back within the deadline: its journal runs the task again
        result, _ = run.finish()
    finally:
        run.stop()
    [task] = result["tasks"]
    assert (task["state"], result["summary"]["tasks_rejected"]) == ("paid", 0)
    assert result["summary"]["voucher_total"] == PLAN.inference_price


def test_failed_voucher_handover_then_the_providers_claim_leaves_later_runs_working(
    world: tuple[Stack, Provider], files: JobFiles, tmp_path: Path
) -> None:
    st, _ = world
    quick = st.start_provider("quick", PLAN, slo_ms=2_000)
    # A window long enough for the daemon's restart: it claims by settleBy minus half of it.
    deal_id = _deal(st, quick, window=60)
    deal = st.escrow.get_deal(deal_id)
    ledger = DealLedger.open(tmp_path, st.escrow.domain.chain_id, st.escrow.address, deal_id)
    account = ClientAccount(st.escrow, st.token, st.client, min_challenge_window=10)
    session = DealSession(
        provider=ProviderHttp(quick.url, client_key=st.client),
        account=account,
        domain=st.escrow.domain,
        deal_id=deal_id,
        plan=PLAN,
        provider_address=quick.address,
        book=VoucherBook(deal_id=deal_id, cap=deal.max_spend),
        challenge_window=deal.challenge_window,
    )
    runner = JobRunner.resume(session, ledger)
    tasks = inference_tasks(
        read_envelope(files.program), [files.inputs["fast0"], files.inputs["fast1"]], 1_000
    )
    results = runner.run(fit_under_cap(tasks, owed=0, cap=deal.max_spend))
    assert [r.state for r in results] == ["paid", "paid"]
    quick.process.kill9()
    assert runner.pay() is None and "voucher not handed over" in (runner.voucher_error or "")
    assert ledger.voucher_delivered is False and ledger.last_signed == 2_000
    ledger.close()
    quick.restart()
    # The daemon got no voucher: it claims both tasks with the client's signed requests.
    wait_until(
        lambda: all(st.escrow.task_status(deal_id, i) == TASK_CLAIMED for i in (0, 1)),
        120,
        "the provider's claim",
    )

    later, _ = job(st, tmp_path, *run_args(deal_id, quick, files, "fast2"))
    summary = later["summary"]
    assert summary["voucher_error"] is None and summary["tasks_paid"] == 1
    assert summary["voucher_total"] == PLAN.inference_price  # the claimed tasks left the voucher
    assert summary["batches_disputed"] == []  # an honest claim of verified work is accepted
    wait_until(
        lambda: st.escrow.task_status(deal_id, 2) == TASK_VOUCHED, 60, "the voucher redeemed"
    )
    status, _ = job(st, tmp_path, "status", "--deal", str(deal_id))
    assert [(t["index"], t["state"], t["chain"]) for t in status["tasks"]] == [
        (0, "verified", "claimed"),
        (1, "verified", "claimed"),
        (2, "verified", "vouched"),
    ]
    batches = status["batches"]  # the daemon's claims: one batch or one per task
    assert sorted(i for b in batches for i in b["tasks"]) == [0, 1]
    assert {b["verdict"] for b in batches} == {"accepted"}
    assert ledger_of(st, tmp_path, deal_id).tasks[2].chain == ChainState.VOUCHED


def test_refund_asks_the_provider_once_more_and_pays_the_delivery_the_crashed_run_missed(
    world: tuple[Stack, Provider], files: JobFiles, tmp_path: Path
) -> None:
    st, provider = world
    deal_id = _deal(st, provider, window=60)  # the daemon would claim 30 s before settleBy
    run = JobProcess(st, tmp_path, *run_args(deal_id, provider, files, "slow3"))
    try:
        wait_ledger(st, tmp_path, deal_id, _acked(1), "the ack", client=run)
    finally:
        run.kill9()
    [task] = ledger_of(st, tmp_path, deal_id).tasks.values()
    assert task.state == TaskState.ACKED  # killed before it saw the result
    wait_until(lambda: delivered_by_provider(st, provider, deal_id) == 1, 60, "the delivery")
    deal = st.escrow.get_deal(deal_id)
    instant = min(task.request.deadline, deal.expiry) + deal.challenge_window
    st.anvil.increase_time(instant + 1 - st.anvil.latest_timestamp())

    refund, _ = job(st, tmp_path, "refund", "--deal", str(deal_id), "--provider-url", provider.url)
    assert (refund["refunds"], refund["pending_refunds"]) == ([], [])
    assert ledger_of(st, tmp_path, deal_id).tasks[0].state == TaskState.VERIFIED
    wait_until(
        lambda: st.escrow.get_deal(deal_id).vouched == PLAN.inference_price,
        60,
        "the provider redeeming the voucher for the delivery",
    )
    assert st.escrow.get_deal(deal_id).stake == UNIT  # no penalty for work delivered in time


def test_a_deadline_the_provider_finds_too_soon_is_signed_again_once_with_more_slack(
    world: tuple[Stack, Provider], files: JobFiles
) -> None:
    st, provider = world
    deal_id = _deal(st, provider)
    deal = st.escrow.get_deal(deal_id)
    session = DealSession(
        provider=ProviderHttp(provider.url, client_key=st.client),
        account=ClientAccount(st.escrow, st.token, st.client, min_challenge_window=10),
        domain=st.escrow.domain,
        deal_id=deal_id,
        plan=PLAN,
        provider_address=provider.address,
        book=VoucherBook(deal_id=deal_id, cap=deal.max_spend),
        challenge_window=deal.challenge_window,
        slo_ms=provider.slo_ms - 3_500,  # our clock or our SLO a little behind the daemon's
    )
    [task] = inference_tasks(read_envelope(files.program), [files.inputs["fast3"]], 1_000)
    outcome = session.submit(task.spec)
    assert outcome.ack is not None and outcome.ack.request_hash == outcome.request.struct_hash()
    # First signed with 57 + 2 s (too soon for the daemon's 60 s), then again with 57 + 2 + 2 s.
    assert outcome.request.deadline - session.now() >= provider.slo_ms / 1000
    with pytest.raises(ProviderRejected, match="deadline_too_soon"):  # only once, not forever
        session.slo_ms = provider.slo_ms - 10_000
        session.submit(task.spec)
