"""`tpumarket job status|watch|refund`: a deal's tasks, its provider's claims, its refunds.

- ``job status``: every task the ledger holds for the deal, with its state on chain; with
  ``--fetch DIR`` the provider is asked for results not collected yet (a crashed run's), they
  are verified, paid and written into ``DIR``.
- ``job watch``: read the provider's claims on chain; dispute those of tasks not delivered
  and verified, or priced above the acks; lapse disputes the arbiter left past its period.
- ``job refund``: refund the deal's pending breached tasks on chain (and watch the claims).
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from pathlib import Path
from types import FrameType
from typing import Any

from client.accounts import ClientAccount
from client.amounts import tokens
from client.cli import (
    Progress,
    UsageError,
    emit_json,
    escrow_from,
    key_from,
    note,
    print_table,
    token_of,
)
from client.errors import ClientError, ProviderRejected, ProviderUnavailable
from client.job_deal import (
    chain_now,
    deal_and_ledger,
    open_ledger,
    open_runner,
    sigint,
    start_block,
    warn,
)
from client.job_records import view_of
from client.job_results import write_output
from client.jobs import JobRunner
from client.ledger import DealLedger, LedgerLocked
from client.ledger_records import TaskRecord, TaskState
from client.tasks import chain_states, settle_by
from client.watch import ClaimWatcher, WatchReport
from contracts.binding import DEAL_OPEN


def refund_breaches(runner: JobRunner, wait: bool) -> list[tuple[int, int, int]]:
    """Refund the tasks whose settlement instant passed; with ``wait``, wait for the rest."""
    escrow = runner.session.account.escrow
    refunds = runner.refund_due(chain_now(escrow))
    pending = len(runner.ledger.pending)
    progress = Progress("refunds", pending) if wait and pending else None
    for index, _, _ in refunds:
        if progress:
            progress.step(f"task {index} refunded")
    while wait and runner.ledger.pending and not runner.abandon.is_set():
        due = runner.next_refund_at()
        assert due is not None
        # Until the chain's clock passes the next settlement instant.
        runner.abandon.wait(max(0.5, min(5.0, due - chain_now(escrow))))
        for index, _, _ in (more := runner.refund_due(chain_now(escrow))):
            if progress:
                progress.step(f"task {index} refunded")
        refunds += more
    if any(t.payable for t in runner.ledger.tasks.values()):
        runner.pay()  # a task delivered after all (asked once more before its refund)
    return refunds


def job_refund(args: argparse.Namespace) -> int:
    with deal_and_ledger(args) as (escrow, ledger):
        runner, _ = open_runner(args, None, ledger, escrow)

        def handler(signum: int, frame: FrameType | None) -> None:
            runner.stop_sending.set()
            runner.abandon.set()
            note("interrupted: no more waiting; the ledger keeps the refunds still pending")

        with sigint(handler):
            refunds = refund_breaches(runner, args.wait)
            report = runner.watch()
        pending = sorted(ledger.pending)
        failed = sorted(i for i in runner.refunds_failed if i in ledger.pending)
    if args.json:
        emit_json(
            {
                "deal_id": args.deal,
                "refunds": [{"index": i, "refund": r, "penalty": p} for i, r, p in refunds],
                "pending_refunds": pending,
                "refunds_failed": failed,
                "batches_disputed": list(report.disputed),
            }
        )
    else:
        if refunds:
            print_table(
                ["task", "refund", "penalty"],
                [[str(i), tokens(r), tokens(p)] for i, r, p in refunds],
            )
        print(f"pending refunds: {', '.join(map(str, pending)) or 'none'}")
        if report.disputed:
            print(f"claims disputed: batches {', '.join(map(str, report.disputed))}")
    if failed:  # due and not refunded: work left undone
        tasks = ", ".join(map(str, failed))
        print(
            f"error: the refunds of tasks {tasks} are due and were not sent (the chain did not "
            f"confirm them); run `tpumarket job refund --deal {args.deal}` again",
            file=sys.stderr,
            flush=True,
        )
        return 1
    return 0


def job_watch(args: argparse.Namespace) -> int:
    with deal_and_ledger(args) as (escrow, ledger):
        key = key_from(args)
        account = ClientAccount(escrow, token_of(args, escrow), key)
        deal = escrow.get_deal(args.deal)
        if deal.client.lower() != account.address.lower():
            raise ClientError(f"deal {args.deal} belongs to {deal.client}, not {account.address}")
        try:
            runner, _ = open_runner(args, None, ledger, escrow)
            watch = runner.watch
        except (UsageError, ProviderUnavailable, ProviderRejected) as exc:
            # Without the provider a task the ledger has not seen verified cannot be asked for
            # once more: its claim is judged from the ledger alone (and disputed).
            warn(f"no provider to ask ({exc}): claims are judged from the ledger alone")
            watch = ClaimWatcher(account, ledger, say=warn, lowest_block=start_block(args)).scan
        stop = threading.Event()

        def handler(signum: int, frame: FrameType | None) -> None:
            stop.set()

        with sigint(handler):
            while True:
                report = watch()
                _print_watch(args, report)
                if not args.follow or escrow.get_deal(args.deal).status != DEAL_OPEN:
                    break
                if stop.wait(args.interval):  # the next look at the chain, or Ctrl-C
                    break
    return 0


def _print_watch(args: argparse.Namespace, report: WatchReport) -> None:
    summary = {
        "deal_id": args.deal,
        "to_block": report.to_block,
        "batches_seen": report.batches_seen,
        "accepted": list(report.accepted),
        "disputed": list(report.disputed),
        "missed": list(report.missed),
        "lapsed": list(report.lapsed),
        "won": list(report.won),
        "lost": list(report.lost),
    }
    if args.json:
        emit_json(summary)
        return
    print(
        f"deal {args.deal} up to block {report.to_block}: {report.batches_seen} new claim(s); "
        + "; ".join(
            f"{name} {', '.join(map(str, values))}"
            for name, values in summary.items()
            if isinstance(values, list) and values
        )
    )


def utc(timestamp: int) -> str:
    """Return a chain timestamp as a UTC time (``2026-12-04 07:30:00 UTC``)."""
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(timestamp))


def job_status(args: argparse.Namespace) -> int:
    escrow = escrow_from(args)
    fetch_dir = Path(args.fetch) if args.fetch else None
    try:
        ledger = open_ledger(args, escrow)
    except LedgerLocked as exc:
        if fetch_dir is not None:
            raise
        note(f"{exc}: showing the ledger as it stands (read-only)")
        ledger = open_ledger(args, escrow, lock=False)
    try:
        written: list[Path] = []
        if fetch_dir is not None:
            runner, _ = open_runner(args, None, ledger, escrow)
            records = runner.status(fetch=True)
            runner.pay()
            for record in records:
                view = view_of(ledger, record)
                if record.state == TaskState.VERIFIED and view is not None and view.outputs:
                    written.append(write_output(fetch_dir, record.index, view))
            records = [ledger.tasks[r.index] for r in records]
        else:
            indices = sorted(ledger.tasks)
            states = chain_states(escrow, args.deal, indices)
            records = [ledger.tasks[i] for i in indices]
            if not ledger.read_only:
                for i, state in states.items():
                    if state is not None and ledger.tasks[i].chain != state:
                        ledger.update(i, chain=state)
                ledger.save()
                records = [ledger.tasks[i] for i in indices]
        deal = escrow.get_deal(args.deal)
        return _print_status(args, ledger, records, written, deal.expiry, deal.challenge_window)
    finally:
        ledger.close()


def _status_detail(ledger: DealLedger, record: TaskRecord) -> str:
    """Return why a task stands where it does: its reason, and its claim's verdict."""
    batch = ledger.batches.get(record.batch) if record.batch is not None else None
    parts = [record.reason or ""]
    if batch is not None:
        parts.append(f"claim {batch.verdict}" + (f" ({batch.outcome})" if batch.outcome else ""))
    return "; ".join(p for p in parts if p)


def _print_status(
    args: argparse.Namespace,
    ledger: DealLedger,
    records: list[TaskRecord],
    written: list[Path],
    expiry: int,
    window: int,
) -> int:
    rows: list[dict[str, Any]] = [
        {
            "index": r.index,
            "run": r.run,
            "task": r.label,
            "state": str(r.state),
            "chain": str(r.chain) if r.chain else "none",
            "batch": r.batch,
            "amount": r.receipt.amount if r.receipt is not None else 0,
            "deadline": r.request.deadline,
            "settle_by": settle_by(r.request.deadline, expiry, window),
            "detail": _status_detail(ledger, r),
        }
        for r in records
    ]
    batches = [b.to_json() for _, b in sorted(ledger.batches.items())]
    unfinished = ledger.unfinished_runs()
    if args.json:
        emit_json(
            {
                "deal_id": args.deal,
                "tasks": rows,
                "batches": batches,
                "unfinished_runs": unfinished,
                "last_voucher": ledger.last_signed,
                "outputs": [str(p) for p in written],
            }
        )
        return 0
    if not rows:
        print(f"deal {args.deal}: no tasks in the ledger {ledger.path}")
        return 0
    print_table(
        ["task", "run", "what", "state", "on chain", "batch", "amount", "settle by", "detail"],
        [
            [
                str(r["index"]),
                str(r["run"]),
                str(r["task"]),
                str(r["state"]),
                str(r["chain"]),
                "-" if r["batch"] is None else str(r["batch"]),
                tokens(int(r["amount"])),
                utc(int(r["settle_by"])),
                str(r["detail"])[:80],
            ]
            for r in rows
        ],
    )
    if batches:
        print()
        print_table(
            ["claimed batch", "tasks", "amount", "verdict", "outcome"],
            [
                [
                    str(b["batch"]),
                    ",".join(map(str, b["tasks"])),
                    tokens(int(b["amount"])),
                    str(b["verdict"]),
                    str(b["outcome"] or "-"),
                ]
                for b in batches
            ],
        )
    if unfinished:
        print(f"unfinished runs: {', '.join(map(str, unfinished))} (rerun to resume their tasks)")
    print(f"last voucher: {tokens(ledger.last_signed)}")
    for path in written:
        print(f"wrote {path}")
    return 0
