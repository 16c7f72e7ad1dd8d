"""A rerun after a crash is idempotent by inputs, whatever was looked at in between.

Property (P2, P5): the client kills -9 a `job run` at some point of the run (every task acked;
a task verified; the voucher signed); in between, the provider may claim on chain what it
delivered, and the user may look with `job status`, fetch with `job status --fetch`, refund
with `job refund`, or do nothing; then the same `job run` runs again. Read from the chain
(`VoucherRedeemed.newTasks`, `ReceiptsClaimed.taskIndexes`) and mapped to inputs by the signed
requests the provider's journal holds, **each input is paid at most once**: a task whose inputs
were sent once is never sent as a new task while its earlier task can still be delivered, paid
or refunded (a claimed task is paid for its input: the rerun fetches its result), and every
input of the rerun ends with its result verified.

Real anvil, a real daemon, the client as `python -m client.cli job ...` (killed with SIGKILL).
Hypothesis draws the crash point, what happens in between and whether the provider claims
first; the examples are few (each is a real run), the failing one of the old client first.
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from tempfile import mkdtemp

import pytest
from hypothesis import HealthCheck, Phase, example, given, settings
from hypothesis import strategies as st_

from client.ledger_records import TaskRecord, TaskState
from contracts.binding import TASK_NONE
from contracts.messages import Plan
from tests.client.jobs_support import (
    STEPS_SLOW,
    JobFiles,
    JobProcess,
    delivered_by_provider,
    job,
    ledger_of,
    run_args,
    write_files,
)
from tests.e2e.audit import JournalTask, read_chain, read_journal
from tests.e2e.stack import UNIT, Provider, Stack, stack
from tests.polling import wait_until

PLAN = Plan(compile_price=2_000, inference_price=1_000)
WINDOW = 60  # the daemon claims from settleBy - 30 s (margin 0.5 x window)
NAMES = ("fast0", "slow0", "slow1")
JOURNAL = "journal.sqlite3"

CRASHES = ("acked", "verified", "signed")
BETWEEN = ("status", "fetch", "refund", "nothing")


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Stack, Provider, JobFiles]]:
    with stack(tmp_path_factory.mktemp("rerun"), lean=True) as built:
        provider = built.start_provider("steady", PLAN, slo_ms=60_000)
        more = 20 * UNIT  # every example opens a deal locking a stake of UNIT
        built.token.mint(built.deployer, provider.address, more)
        built.token.approve(provider.key, built.escrow.address, more)
        built.escrow.stake(provider.key, more)
        built.escrow.deposit(built.client, 10 * UNIT)
        steps = {"fast0": 1_000, "slow0": STEPS_SLOW, "slow1": STEPS_SLOW}
        files = write_files(tmp_path_factory.mktemp("inputs"), steps)
        yield built, provider, files


def _crashed(crash: str) -> Callable[[DealView], bool]:
    def acked(view: DealView) -> bool:
        return len(view.tasks) == len(NAMES) and all(t.ack for t in view.tasks.values())

    def verified(view: DealView) -> bool:
        return any(t.state == TaskState.VERIFIED for t in view.tasks.values())

    def signed(view: DealView) -> bool:
        return view.last_signed > 0

    return {"acked": acked, "verified": verified, "signed": signed}[crash]


class DealView:
    """The client's ledger as another process sees it (read-only)."""

    def __init__(self, st: Stack, state: Path, deal_id: int) -> None:
        ledger = ledger_of(st, state, deal_id)
        try:
            self.tasks: dict[int, TaskRecord] = dict(ledger.tasks)
            self.last_signed = ledger.last_signed
        finally:
            ledger.close()


def _kill_at(st: Stack, state: Path, deal_id: int, run: JobProcess, crash: str) -> None:
    """SIGKILL the run once its ledger reaches the crash point (or leave it if it ended)."""
    reached = _crashed(crash)

    def at_point() -> bool:
        if run.popen.poll() is not None:
            return True
        try:
            return reached(DealView(st, state, deal_id))
        except (OSError, ValueError):  # no ledger yet
            return False

    wait_until(at_point, 240, f"the run reaching {crash}")
    with contextlib.suppress(ProcessLookupError):
        os.kill(run.popen.pid, signal.SIGKILL)
    run.popen.wait(30)
    run.stop()


def _delivered_all(st: Stack, provider: Provider, deal_id: int, state: Path) -> None:
    """Wait until the daemon delivered every task the crashed run got acked."""
    acked = sum(t.ack is not None for t in DealView(st, state, deal_id).tasks.values())
    wait_until(lambda: delivered_by_provider(st, provider, deal_id) >= acked, 240, "the deliveries")


def _provider_claims(st: Stack, provider: Provider, deal_id: int) -> None:
    """Move the chain's clock into the claim margin of the delivered tasks; wait until the
    daemon put every one of them on chain (claimed, or vouched by a voucher it redeemed)."""
    journal = {k: t for k, t in _journal(st, provider).items() if k[0] == deal_id}
    delivered = [t for t in journal.values() if t.delivered_on_time]
    if not delivered:
        return
    deal = st.escrow.get_deal(deal_id)
    # settleBy - margin + 5 s of the latest task: every task is in its claim margin then
    # (their deadlines are seconds apart, the margin is 30 s).
    target = max(t.request.deadline for t in delivered) + WINDOW - WINDOW // 2 + 5
    earliest = min(t.request.deadline for t in delivered) + deal.challenge_window
    assert target < earliest - 5, "the tasks' deadlines are too far apart for one claim"
    now = st.anvil.latest_timestamp()
    if target > now:
        st.anvil.increase_time(target - now)
    indices = [t.ack.task_index for t in delivered]
    wait_until(
        lambda: all(st.escrow.task_status(deal_id, i) != TASK_NONE for i in indices),
        120,
        "the daemon's claim of the delivered tasks",
    )


def _past_settlement(st: Stack, deal_id: int, state: Path) -> None:
    """Move the chain's clock past every acked task's settlement instant."""
    deal = st.escrow.get_deal(deal_id)
    tasks = DealView(st, state, deal_id).tasks.values()
    instants = [min(t.request.deadline, deal.expiry) + deal.challenge_window for t in tasks]
    now = st.anvil.latest_timestamp()
    if instants and max(instants) + 2 > now:
        st.anvil.increase_time(max(instants) + 2 - now)


def _journal(st: Stack, provider: Provider) -> dict[tuple[int, int], JournalTask]:
    return read_journal(st.work / provider.name / JOURNAL)


def inputs_paid(st: Stack, provider: Provider, deal_id: int) -> Counter[bytes]:
    """Return how many times the chain paid (or holds a claim for) each input of the deal.

    Paid tasks come from the escrow's events (tasks newly covered by a redeemed voucher,
    tasks claimed in a batch the client did not win); each task's input is the one of the
    client's signed request the provider journaled.
    """
    chain = read_chain(st.escrow)
    journal = _journal(st, provider)
    paid = {k for k in chain.vouched | chain.claimed if k[0] == deal_id} - chain.disputed
    assert paid <= set(journal), "a task paid that the provider never acked"
    return Counter(journal[k].request.input_hash for k in paid)


@settings(
    max_examples=4,
    deadline=None,
    derandomize=True,
    database=None,
    phases=[Phase.explicit, Phase.generate],
    suppress_health_check=list(HealthCheck),
)
@example(crash="verified", between="status", claim=True)  # what paid twice before
@example(crash="acked", between="refund", claim=True)
@given(
    crash=st_.sampled_from(CRASHES),
    between=st_.sampled_from(BETWEEN),
    claim=st_.booleans(),
)
def test_a_rerun_after_a_crash_pays_each_input_at_most_once_whatever_happened_between(
    world: tuple[Stack, Provider, JobFiles], crash: str, between: str, claim: bool
) -> None:
    st, provider, files = world
    quote = st.quote(provider, max_spend=100_000, window=WINDOW)
    deal_id = st.open_deal(quote, provider)
    state = Path(mkdtemp(prefix="rerun-state-", dir=st.work))
    args = run_args(deal_id, provider, files, *NAMES)

    first = JobProcess(st, state, *args)
    try:
        _kill_at(st, state, deal_id, first, crash)
    finally:
        first.stop()
    _delivered_all(st, provider, deal_id, state)
    if claim:
        _provider_claims(st, provider, deal_id)
    common = ["--deal", str(deal_id), "--provider-url", provider.url]
    if between == "status":
        job(st, state, "status", *common)
    elif between == "fetch":
        job(st, state, "status", *common, "--fetch", str(state / "fetched"))
    elif between == "refund":
        _past_settlement(st, deal_id, state)
        job(st, state, "refund", *common)

    rerun, _ = job(st, state, *args)
    assert len(rerun["tasks"]) == len(NAMES)
    assert {t["state"] for t in rerun["tasks"]} <= {"paid", "claimed"}, rerun["tasks"]
    voucher = int(rerun["summary"]["voucher_total"])
    wait_until(lambda: st.escrow.get_deal(deal_id).vouched >= voucher, 60, "the voucher redeemed")
    paid = inputs_paid(st, provider, deal_id)
    assert max(paid.values(), default=0) <= 1, (crash, between, claim, dict(paid))
