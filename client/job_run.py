"""`tpumarket job run`: submit tasks read from files to a deal's provider, verify, pay, refund.

Before sending, the batch is fitted under the cap (the deal's locked maximum, or a lower
``--cap``) at each task's maximum price: the projected bill is printed, a warning is given as
it nears the cap, and tasks that could pass it are not sent. Every inputs file is checked
against the program's signature first (``client.job_files``): nothing is sent or billed for one
that does not fit. A rerun after a crash resumes the crashed run's tasks with the same inputs.

Verified outputs are written (``--out``) as soon as the tasks are collected, before the
settlement steps (voucher, refunds, claims); a step that fails (the chain or the provider not
answering) does not lose them: the table and the JSON are printed all the same, saying what is
still pending and how to finish it, and the command exits 1 (so does a voucher the provider
did not take, and a run that leaves tasks undone: it names them and says to rerun the same
command, which resumes them by their inputs). While nothing moves for a while,
the progress says what the run waits for and whether the provider and the chain answer.

Ctrl-C once: no more tasks are sent, those in flight are collected until their deadline plus
the grace, verified ones are paid and saved, and the table is printed; twice: the run stops at
once, the ledger keeps what is pending and the command says what.
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from types import FrameType
from typing import Any, TypeVar

import httpx

from client.amounts import tokens
from client.cli import REMOTE_ERRORS, Progress, UsageError, emit_json, note, print_table
from client.errors import ClientError
from client.job_cap import fit_under_cap
from client.job_deal import deal_and_ledger, open_runner, sigint, warn
from client.job_files import (
    JobTask,
    compile_tasks,
    default_max_price,
    inference_tasks,
    read_envelope,
)
from client.job_results import TaskResult, save_outputs
from client.job_status import refund_breaches
from client.jobs import JobRunner
from client.ledger_records import OPEN_STATES, ChainState
from client.watch import WatchReport
from contracts.binding import DEAL_OPEN
from contracts.messages import Plan

INTERRUPTED = 130  # exit code of a run stopped by a second Ctrl-C
UNDONE_STATES = frozenset({"unknown", "pending", "error"})
"""Outcomes of work the run was asked to do and left undone: it exits 1 naming them."""
QUIET_S = 10.0  # after this long with no progress, say what the run waits for
T = TypeVar("T")


def _answers_http(url: str) -> str:
    try:
        httpx.get(url, timeout=3.0)
    except httpx.HTTPError as exc:
        return f"not answering ({type(exc).__name__})"
    return "answering"


def _answers_rpc(url: str) -> str:
    body = {"jsonrpc": "2.0", "method": "eth_blockNumber", "params": [], "id": 1}
    try:
        httpx.post(url, json=body, timeout=3.0).raise_for_status()
    except httpx.HTTPError as exc:
        return f"not answering ({type(exc).__name__})"
    return "answering"


class Waiting:
    """Say on stderr what a run waits for once nothing has moved for ``quiet_s`` seconds."""

    def __init__(self, provider_url: str, rpc_url: str, *, quiet_s: float = QUIET_S) -> None:
        self.provider_url, self.rpc_url, self.quiet_s = provider_url, rpc_url, quiet_s
        self._what: Callable[[], str] = lambda: "starting"
        self._last = time.monotonic()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="job-waiting", daemon=True)

    def moved(self) -> None:
        """Record progress: the quiet period starts again."""
        self._last = time.monotonic()

    def phase(self, what: Callable[[], str]) -> None:
        """Name what the run does now (asked afresh each time it is reported)."""
        self._what = what
        self.moved()

    def __enter__(self) -> Waiting:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _loop(self) -> None:
        while not self._stop.wait(1.0):
            quiet = time.monotonic() - self._last
            if quiet >= self.quiet_s:
                provider = _answers_http(self.provider_url.rstrip("/") + "/v1/health")
                chain = _answers_rpc(self.rpc_url)
                if not self._stop.is_set():
                    note(
                        f"waiting {quiet:.0f} s: {self._what()}; provider {self.provider_url} "
                        f"{provider}; chain {self.rpc_url} {chain}"
                    )
                self._last = time.monotonic()


class Settlement:
    """The settlement steps after a batch; a failed step is recorded, never fatal."""

    def __init__(self, waiting: Waiting) -> None:
        self.waiting = waiting
        self.errors: list[str] = []

    def step(self, name: str, what: str, action: Callable[[], T]) -> T | None:
        """Run ``action``; on a remote failure record ``name: why`` and return None."""
        self.waiting.phase(lambda: what)
        try:
            return action()
        except REMOTE_ERRORS as exc:
            reason = " ".join(str(exc).split())[:300] or type(exc).__name__
            self.errors.append(f"{name}: {reason}")
            warn(f"{name} failed: {reason}")
            return None


def _tasks(args: argparse.Namespace) -> list[JobTask]:
    """Read and check the files, before anything else: tasks priced at 0 for now."""
    envelope = read_envelope(Path(args.program))
    tasks = compile_tasks(envelope, args.compile, 0) if args.compile else []
    if not args.compile or args.inputs:
        tasks += inference_tasks(envelope, [Path(p) for p in args.inputs], 0)
    return tasks


def _priced(args: argparse.Namespace, tasks: list[JobTask], plan: Plan) -> list[JobTask]:
    """Give each task its maximum price: ``--max-price``, else the plan's for its kind."""
    priced = []
    for task in tasks:
        kind = task.spec.kind
        max_price = args.max_price if args.max_price is not None else default_max_price(plan, kind)
        if max_price is None:
            raise UsageError("the deal's plan is metered: pass --max-price per task")
        priced.append(replace(task, spec=replace(task.spec, max_price=max_price)))
    return priced


@contextmanager
def _ctrl_c(runner: JobRunner, in_flight: Callable[[], int]) -> Iterator[None]:
    """Route Ctrl-C to the runner: the first stops sending, the second stops waiting."""

    def handler(signum: int, frame: FrameType | None) -> None:
        if runner.interrupt() == 1:
            note(
                f"interrupted: no more tasks are sent; collecting the {in_flight()} in flight "
                "until each deadline plus the grace (Ctrl-C again to stop waiting)"
            )
        else:
            note("interrupted again: stopping now; the ledger keeps what is pending")

    with sigint(handler):
        yield


def job_run(args: argparse.Namespace) -> int:
    """Run the tasks of ``--program`` and ``--inputs`` on ``--deal``; print what became of them."""
    files = _tasks(args)  # bad files or inputs: exit 2 before the chain or provider is asked
    with deal_and_ledger(args) as (escrow, ledger):
        runner, cap = open_runner(args, args.cap, ledger, escrow)
        if escrow.get_deal(args.deal).status != DEAL_OPEN:
            raise ClientError(f"deal {args.deal} is not open")
        session = runner.session
        tasks = _priced(args, files, session.plan)
        plan = fit_under_cap(tasks, owed=session.book.total, cap=cap)
        note(
            f"deal {args.deal}: {len(plan.run)} task(s), projected bill "
            f"{tokens(plan.projected)} of cap {tokens(cap)} ({tokens(plan.owed)} already owed)"
        )
        if plan.warning:
            warn(plan.warning)
        progress = Progress("tasks", len(plan.run))
        counts = {"paid": 0, "failed": 0, "unpaid": 0}
        waiting = Waiting(session.provider.base_url, args.rpc_url)

        def done(result: TaskResult) -> None:
            o = result.outcome
            key = "paid" if o and o.succeeded else "failed" if o and o.verified else "unpaid"
            counts[key] += 1
            waiting.moved()
            progress.step(
                f"verified {counts['paid'] + counts['failed']} not paid {counts['unpaid']} "
                f"spend {tokens(session.book.total)}/{tokens(cap)}"
            )

        in_flight = runner.in_flight
        with _ctrl_c(runner, in_flight), waiting:
            waiting.phase(lambda: f"{in_flight()} task(s) sent and not yet delivered")
            results = runner.run(
                plan,
                concurrency=args.concurrency,
                wait_s=args.wait_s,
                on_done=done if plan.run else None,
            )
            if runner.abandon.is_set():
                return _abandoned(args, runner, results)
            written = save_outputs(results, Path(args.out)) if args.out else []
            settle = Settlement(waiting)
            voucher = settle.step("voucher", "paying verified tasks (chain, provider)", runner.pay)
            if runner.voucher_error:  # signed and kept, not handed over: the payment is undone
                settle.errors.append(f"voucher: {runner.voucher_error}")
            wait = args.wait_refunds and not runner.stop_sending.is_set()
            refunds = settle.step(
                "refunds",
                "refunding breached tasks (chain)",
                lambda: refund_breaches(runner, wait),
            )
            report = settle.step("claims", "reading the provider's claims (chain)", runner.watch)
            runner.finish()
        return _report(
            args,
            runner,
            results,
            voucher.cumulative_amount if voucher else None,
            refunds or [],
            cap,
            written,
            report,
            settle.errors,
        )


def _abandoned(args: argparse.Namespace, runner: JobRunner, results: list[TaskResult]) -> int:
    """Say what a run stopped by a second Ctrl-C left pending, and how to resume it."""
    pending = sorted(
        i for i, t in runner.ledger.tasks.items() if t.run == runner._run and t.state in OPEN_STATES
    )
    verified = sorted(
        r.outcome.index for r in results if r.outcome is not None and r.outcome.verified
    )
    note(
        f"stopped: tasks {', '.join(map(str, pending)) or 'none'} acked and not collected; "
        f"{len(verified)} verified and not paid yet. The ledger keeps them: rerun "
        "`tpumarket job run` with the same inputs to resume them, or "
        f"`tpumarket job status --deal {args.deal} --fetch DIR` to fetch and pay them."
    )
    if args.json:
        emit_json(
            {
                "summary": {
                    "deal_id": args.deal,
                    "interrupted": 2,
                    "pending": pending,
                    "verified_unpaid": verified,
                }
            }
        )
    return INTERRUPTED


def _report(
    args: argparse.Namespace,
    runner: JobRunner,
    results: list[TaskResult],
    voucher: int | None,
    refunds: list[tuple[int, int, int]],
    cap: int,
    written: list[Path],
    watch: WatchReport | None,
    errors: list[str],
) -> int:
    book, ledger = runner.session.book, runner.ledger
    states = [r.state for r in results]
    # Verified and owed, and no voucher the provider took covers them yet.
    unpaid = sorted(
        i
        for i, t in ledger.tasks.items()
        if t.payable
        and t.chain != ChainState.VOUCHED
        and not (ledger.voucher_delivered and i in ledger.last_tasks)
    )
    undone = [r for r in results if r.state in UNDONE_STATES]
    summary = {
        "deal_id": args.deal,
        "tasks_sent": sum(r.outcome is not None for r in results),
        "tasks_resumed": sum(r.resumed for r in results),
        "tasks_paid": states.count("paid"),
        "failures_diagnosed": sum(s.startswith("failed") for s in states),
        "tasks_rejected": states.count("rejected") + states.count("undelivered"),
        "tasks_refunded": len(refunds),
        "tasks_skipped": states.count("skipped"),
        "tasks_not_sent": states.count("not sent"),
        "tasks_errored": states.count("error"),
        "spent": sum(r.amount for r in results),
        "voucher_total": book.last_signed,
        "voucher_signed": voucher is not None,
        "voucher_error": runner.voucher_error,
        "refunded": sum(r for _, r, _ in refunds),
        "penalties": sum(p for _, _, p in refunds),
        "pending_refunds": sorted(ledger.pending),
        "pending_payment": unpaid,
        "batches_disputed": list(watch.disputed) if watch else [],
        "interrupted": 1 if runner.stop_sending.is_set() else 0,
        "cap": cap,
        "settlement_errors": errors,
        "tasks_undone": [r.task.label for r in undone],
    }
    rows: list[dict[str, Any]] = [
        {
            "index": r.index,
            "task": r.task.label,
            "state": r.state,
            "amount": r.amount,
            "detail": r.detail(),
        }
        for r in results
    ]
    code = 1 if errors or undone else 0
    pending = _pending_lines(args, summary)
    if args.json:
        emit_json({"summary": summary, "tasks": rows, "outputs": [str(p) for p in written]})
        _say_pending(pending, errors)
        _say_undone(undone)
        return code
    print_table(
        ["task", "what", "outcome", "paid", "detail"],
        [
            [
                "-" if r["index"] is None else str(r["index"]),
                str(r["task"]),
                str(r["state"]),
                tokens(int(r["amount"])),
                str(r["detail"]),
            ]
            for r in rows
        ],
    )
    print()
    print_table(
        ["settlement", "value"],
        [
            ["tasks sent", f"{summary['tasks_sent']} ({summary['tasks_resumed']} resumed)"],
            ["paid", str(summary["tasks_paid"])],
            ["failed, diagnosed (billed by the plan)", str(summary["failures_diagnosed"])],
            ["not paid (rejected or undelivered)", str(summary["tasks_rejected"])],
            [
                "refunded on chain",
                f"{len(refunds)}: {tokens(summary['refunded'])} back, "
                f"penalties {tokens(summary['penalties'])}",
            ],
            ["not sent (cap)", str(summary["tasks_skipped"])],
            ["not sent (interrupted)", str(summary["tasks_not_sent"])],
            ["spent this run", tokens(summary["spent"])],
            ["voucher total (deal)", f"{tokens(book.last_signed)} of cap {tokens(cap)}"],
            ["refunds pending", ", ".join(map(str, summary["pending_refunds"])) or "none"],
            ["claims disputed", ", ".join(map(str, summary["batches_disputed"])) or "none"],
        ],
    )
    if runner.voucher_error:
        print(f"voucher: {runner.voucher_error} (the next run hands it over again)")
    for path in written:
        print(f"wrote {path}")
    _say_pending(pending, errors)
    _say_undone(undone)
    return code


def _say_undone(undone: list[TaskResult]) -> None:
    """Name the tasks the run left undone (not known to be acked, not collected, not sent
    for an error) and how to finish them: the same command resumes them."""
    if not undone:
        return
    named = "; ".join(
        f"{r.task.label}" + (f" (task {r.index})" if r.index is not None else "") + f": {r.state}"
        for r in undone
    )
    print(
        f"error: {len(undone)} task(s) left undone: {named}. To finish them, rerun the same "
        "command: it resumes them by their inputs (nothing is sent or paid twice)",
        file=sys.stderr,
        flush=True,
    )


def _pending_lines(args: argparse.Namespace, summary: dict[str, Any]) -> list[str]:
    lines = []
    if summary["settlement_errors"] and summary["pending_payment"]:
        tasks = ", ".join(map(str, summary["pending_payment"]))
        lines.append(
            f"tasks {tasks} are verified and not paid yet: `tpumarket job status --deal "
            f"{args.deal} --fetch DIR` pays them once the chain and the provider answer"
        )
    if summary["settlement_errors"] and summary["pending_refunds"]:
        tasks = ", ".join(map(str, summary["pending_refunds"]))
        lines.append(
            f"tasks {tasks} wait for their refund: `tpumarket job refund --deal {args.deal} --wait`"
        )
    return lines


def _say_pending(lines: list[str], errors: list[str]) -> None:
    if not errors:
        return
    for line in lines:
        print(f"pending: {line}", file=sys.stderr, flush=True)
    print(
        f"error: settlement incomplete ({'; '.join(errors)}); the outputs above are saved and "
        "the ledger keeps what is pending",
        file=sys.stderr,
        flush=True,
    )
