"""`tpumarket job ...`: run batches of compile and inference tasks on a deal; export models.

- ``job run``: submit tasks read from files to the deal's provider (bounded concurrency),
  verify every delivery, pay verified ones with a cumulative voucher, refund breaches on
  chain, judge the provider's claims. Before sending, the batch is fitted under the cap (the
  deal's locked maximum, or a lower ``--cap``) at each task's maximum price: the projected bill
  is printed, a warning is given as it nears the cap, and tasks that could pass it are not
  sent. A rerun after a crash resumes the crashed run's tasks with the same inputs. Ctrl-C
  once: no more tasks are sent, those in flight are collected until their deadline plus the
  grace, verified ones are paid and saved, and the table is printed; twice: the run stops at
  once, the ledger keeps what is pending and the command says what.
- ``job status``: every task the ledger holds for the deal, with its state on chain; with
  ``--fetch DIR`` the provider is asked for results not collected yet (a crashed run's), they
  are verified, paid and written into ``DIR``.
- ``job watch``: read the provider's claims on chain; dispute those of tasks not delivered
  and verified, or priced above the acks; lapse disputes the arbiter left past its period.
- ``job refund``: refund the deal's pending breached tasks on chain (and watch the claims).
- ``job export``: write a model of the zoo as a program envelope and an example inputs file.

A run keeps the deal's ledger (``client.ledger``) under ``--state-dir``, so a later run signs
vouchers that stay cumulative and never reuses a task index; one process at a time holds a
deal (a second ``job run`` on it fails at once). Registered by ``client.cli.register`` beside
``tpumarket client``.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import Any

from client.accounts import ClientAccount
from client.cli import (
    Progress,
    UsageError,
    common_options,
    emit_json,
    escrow_from,
    guarded,
    key_from,
    parse_amount,
    positive_int,
    print_table,
    tokens,
)
from client.errors import ClientError, ProviderRejected, ProviderUnavailable
from client.export_cli import extend as extend_export
from client.jobs import (
    JobRunner,
    TaskResult,
    compile_tasks,
    default_max_price,
    fit_under_cap,
    inference_tasks,
    read_envelope,
    save_outputs,
    view_of,
    write_output,
)
from client.ledger import OPEN_STATES, DealLedger, LedgerLocked, TaskRecord, TaskState
from client.market_http import MarketHttp
from client.provider_http import ProviderHttp
from client.session import DealSession, chain_states, settle_by
from client.vouchers import VoucherBook
from client.watch import ClaimWatcher, WatchReport, deal_logs, find_open_block
from contracts.binding import DEAL_OPEN, Chain, Escrow
from contracts.errors import ChainError
from contracts.messages import KIND_COMPILE, KIND_INFERENCE, Plan
from contracts.program import encode_arrays, encode_envelope

STATE_ENV = "TPUMARKET_CLIENT_STATE"
FROM_BLOCK_ENV = "TPUMARKET_ESCROW_BLOCK"
INTERRUPTED = 130  # exit code of a run stopped by a second Ctrl-C


def state_dir_of(args: argparse.Namespace) -> Path:
    """Return the folder of the deal ledgers: ``--state-dir``, the environment, or ~."""
    if getattr(args, "state_dir", None) is not None:
        return Path(args.state_dir)
    return Path(os.environ.get(STATE_ENV) or Path.home() / ".tpumarket" / "client")


def _chain_now(escrow: Escrow) -> int:
    """Return the chain's time as far as it can be known: its pending block's, or later."""
    pending = int(escrow.tx.w3.eth.get_block("pending")["timestamp"])
    return max(pending, int(time.time()))


def _provider_url(args: argparse.Namespace, provider: str) -> str:
    if args.provider_url:
        return str(args.provider_url)
    if not args.market_url:
        raise UsageError("no provider: pass --provider-url, or --market-url to look it up")
    market = MarketHttp(args.market_url)
    try:
        for advert in market.providers():
            if str(advert.get("address", "")).lower() == provider.lower():
                return str(advert["endpoint"])
    finally:
        market.close()
    raise ClientError(f"the market knows no endpoint for provider {provider}")


def _open_ledger(args: argparse.Namespace, escrow: Escrow, *, lock: bool = True) -> DealLedger:
    return DealLedger.open(
        state_dir_of(args), escrow.domain.chain_id, escrow.address, args.deal, lock=lock
    )


def _deal_slo(escrow: Escrow, ledger: DealLedger, lowest: int) -> int | None:
    """Return the deal's sloMs from its ``DealOpened`` event (None if it cannot be found)."""
    try:
        if ledger.open_block is None:
            block, args = find_open_block(escrow, ledger.deal_id, lowest=lowest)
            ledger.open_block = block
            ledger.save()
            return int(args["sloMs"])
        for _, args in deal_logs(
            escrow, "DealOpened", ledger.deal_id, ledger.open_block, ledger.open_block
        ):
            return int(args["sloMs"])
    except ChainError:
        return None
    return None


def _open_runner(
    args: argparse.Namespace, cap: int | None, ledger: DealLedger, escrow: Escrow
) -> tuple[JobRunner, int]:
    """Check the deal and the provider's terms against the chain; resume the deal's ledger."""
    key = key_from(args)
    account = ClientAccount(escrow, Chain(args.rpc_url).token(escrow.token()), key)
    deal = escrow.get_deal(args.deal)
    if deal.client.lower() != account.address.lower():
        raise ClientError(f"deal {args.deal} belongs to {deal.client}, not to {account.address}")
    provider = ProviderHttp(_provider_url(args, deal.provider), client_key=key)
    info = provider.info()
    plan = Plan.from_json(info["plan"])
    if str(info.get("provider", "")).lower() != deal.provider.lower():
        raise ClientError(f"that endpoint serves {info.get('provider')}, not {deal.provider}")
    if plan.struct_hash() != deal.plan_hash:
        raise ClientError("the provider's plan is not the plan the deal was opened with")
    slo_ms = _deal_slo(escrow, ledger, args.from_block) or int(info["slo_ms"])
    deal_cap = deal.max_spend if cap is None else min(cap, deal.max_spend)
    session = DealSession(
        provider=provider,
        account=account,
        domain=escrow.domain,
        deal_id=args.deal,
        plan=plan,
        provider_address=deal.provider,
        book=VoucherBook(deal_id=args.deal, cap=deal_cap, on_warning=_warn),
        challenge_window=deal.challenge_window,
        spot_check_fraction=getattr(args, "spot_check", 0.0),
        slo_ms=slo_ms,
        expiry=deal.expiry,
        grace_s=getattr(args, "grace_s", 5.0),
    )
    runner = JobRunner.resume(session, ledger, say=_warn)
    runner.lowest_block = args.from_block
    return runner, deal_cap


@contextmanager
def _deal(args: argparse.Namespace, *, lock: bool = True) -> Iterator[tuple[Escrow, DealLedger]]:
    """Open the escrow and the deal's ledger (locked: one process per deal at a time)."""
    escrow = escrow_from(args)
    ledger = _open_ledger(args, escrow, lock=lock)
    try:
        yield escrow, ledger
    finally:
        ledger.close()


def _warn(message: str) -> None:
    print(f"warning: {message}", file=sys.stderr, flush=True)


def _note(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _tasks(args: argparse.Namespace, plan: Plan) -> list[Any]:
    envelope = read_envelope(Path(args.program))
    tasks = []
    for kind, wanted in (
        (KIND_COMPILE, bool(args.compile)),
        (KIND_INFERENCE, not args.compile or args.inputs),
    ):
        if not wanted:
            continue
        max_price = args.max_price if args.max_price is not None else default_max_price(plan, kind)
        if max_price is None:
            raise UsageError("the deal's plan is metered: pass --max-price per task")
        if kind == KIND_COMPILE:
            tasks += compile_tasks(envelope, args.compile, max_price)
        else:
            tasks += inference_tasks(envelope, [Path(p) for p in args.inputs], max_price)
    return tasks


@contextmanager
def _signal(handler: Any) -> Iterator[None]:
    """Install a SIGINT handler for the command's duration (main thread only)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


@contextmanager
def _ctrl_c(runner: JobRunner, in_flight: Any) -> Iterator[None]:
    """Route Ctrl-C to the runner: the first stops sending, the second stops waiting."""

    def handler(signum: int, frame: FrameType | None) -> None:
        if runner.interrupt() == 1:
            _note(
                f"interrupted: no more tasks are sent; collecting the {in_flight()} in flight "
                "until each deadline plus the grace (Ctrl-C again to stop waiting)"
            )
        else:
            _note("interrupted again: stopping now; the ledger keeps what is pending")

    with _signal(handler):
        yield


def _job_run(args: argparse.Namespace) -> int:
    with _deal(args) as (escrow, ledger):
        runner, cap = _open_runner(args, args.cap, ledger, escrow)
        if escrow.get_deal(args.deal).status != DEAL_OPEN:
            raise ClientError(f"deal {args.deal} is not open")
        session = runner.session
        tasks = _tasks(args, session.plan)
        plan = fit_under_cap(tasks, owed=session.book.total, cap=cap)
        print(
            f"deal {args.deal}: {len(plan.run)} task(s), projected bill "
            f"{tokens(plan.projected)} of cap {tokens(cap)} ({tokens(plan.owed)} already owed)",
            file=sys.stderr,
            flush=True,
        )
        if plan.warning:
            _warn(plan.warning)
        progress = Progress("tasks", len(plan.run))
        counts = {"paid": 0, "failed": 0, "unpaid": 0}

        def done(result: TaskResult) -> None:
            o = result.outcome
            key = "paid" if o and o.succeeded else "failed" if o and o.verified else "unpaid"
            counts[key] += 1
            progress.step(
                f"verified {counts['paid'] + counts['failed']} not paid {counts['unpaid']} "
                f"spend {tokens(session.book.total)}/{tokens(cap)}"
            )

        def in_flight() -> int:
            return sum(
                1 for t in ledger.tasks.values() if t.run == runner._run and t.state in OPEN_STATES
            )

        with _ctrl_c(runner, in_flight):
            results = runner.run(
                plan,
                concurrency=args.concurrency,
                wait_s=args.wait_s,
                on_done=done if plan.run else None,
            )
            if runner.abandon.is_set():
                return _abandoned(args, runner, results)
            voucher = runner.pay()
            wait = args.wait_refunds and not runner.stop_sending.is_set()
            refunds = _refund(runner, wait)
            report = runner.watch()
            written = save_outputs(results, Path(args.out)) if args.out else []
            runner.finish()
        return _report(
            args,
            runner,
            results,
            voucher.cumulative_amount if voucher else None,
            refunds,
            cap,
            written,
            report,
        )


def _abandoned(args: argparse.Namespace, runner: JobRunner, results: list[TaskResult]) -> int:
    """Say what a run stopped by a second Ctrl-C left pending, and how to resume it."""
    pending = sorted(
        i for i, t in runner.ledger.tasks.items() if t.run == runner._run and t.state in OPEN_STATES
    )
    verified = sorted(
        r.outcome.index for r in results if r.outcome is not None and r.outcome.verified
    )
    _note(
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


def _refund(runner: JobRunner, wait: bool) -> list[tuple[int, int, int]]:
    escrow = runner.session.account.escrow
    refunds = runner.refund_due(_chain_now(escrow))
    pending = len(runner.ledger.pending)
    progress = Progress("refunds", pending) if wait and pending else None
    for index, _, _ in refunds:
        if progress:
            progress.step(f"task {index} refunded")
    while wait and runner.ledger.pending and not runner.abandon.is_set():
        due = runner.next_refund_at()
        assert due is not None
        # Until the chain's clock passes the next settlement instant.
        runner.abandon.wait(max(0.5, min(5.0, due - _chain_now(escrow))))
        for index, _, _ in (more := runner.refund_due(_chain_now(escrow))):
            if progress:
                progress.step(f"task {index} refunded")
        refunds += more
    if any(t.payable for t in runner.ledger.tasks.values()):
        runner.pay()  # a task delivered after all (asked once more before its refund)
    return refunds


def _report(
    args: argparse.Namespace,
    runner: JobRunner,
    results: list[TaskResult],
    voucher: int | None,
    refunds: list[tuple[int, int, int]],
    cap: int,
    written: list[Path],
    watch: WatchReport,
) -> int:
    book, ledger = runner.session.book, runner.ledger
    states = [r.state for r in results]
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
        "batches_disputed": list(watch.disputed),
        "interrupted": 1 if runner.stop_sending.is_set() else 0,
        "cap": cap,
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
    if args.json:
        emit_json({"summary": summary, "tasks": rows, "outputs": [str(p) for p in written]})
        return 0
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
            ["claims disputed", ", ".join(map(str, watch.disputed)) or "none"],
        ],
    )
    if runner.voucher_error:
        print(f"voucher: {runner.voucher_error} (the next run hands it over again)")
    for path in written:
        print(f"wrote {path}")
    return 0


def _job_refund(args: argparse.Namespace) -> int:
    with _deal(args) as (escrow, ledger):
        runner, _ = _open_runner(args, None, ledger, escrow)

        def handler(signum: int, frame: FrameType | None) -> None:
            runner.stop_sending.set()
            runner.abandon.set()
            _note("interrupted: no more waiting; the ledger keeps the refunds still pending")

        with _signal(handler):
            refunds = _refund(runner, args.wait)
            report = runner.watch()
        pending = sorted(ledger.pending)
    if args.json:
        emit_json(
            {
                "deal_id": args.deal,
                "refunds": [{"index": i, "refund": r, "penalty": p} for i, r, p in refunds],
                "pending_refunds": pending,
                "batches_disputed": list(report.disputed),
            }
        )
        return 0
    if refunds:
        print_table(
            ["task", "refund", "penalty"], [[str(i), tokens(r), tokens(p)] for i, r, p in refunds]
        )
    print(f"pending refunds: {', '.join(map(str, pending)) or 'none'}")
    if report.disputed:
        print(f"claims disputed: batches {', '.join(map(str, report.disputed))}")
    return 0


def _job_watch(args: argparse.Namespace) -> int:
    with _deal(args) as (escrow, ledger):
        key = key_from(args)
        account = ClientAccount(escrow, Chain(args.rpc_url).token(escrow.token()), key)
        deal = escrow.get_deal(args.deal)
        if deal.client.lower() != account.address.lower():
            raise ClientError(f"deal {args.deal} belongs to {deal.client}, not {account.address}")
        try:
            runner, _ = _open_runner(args, None, ledger, escrow)
            watch = runner.watch
        except (UsageError, ProviderUnavailable, ProviderRejected) as exc:
            # Without the provider a task the ledger has not seen verified cannot be asked for
            # once more: its claim is judged from the ledger alone (and disputed).
            _warn(f"no provider to ask ({exc}): claims are judged from the ledger alone")
            watch = ClaimWatcher(account, ledger, say=_warn, lowest_block=args.from_block).scan
        stop = threading.Event()

        def handler(signum: int, frame: FrameType | None) -> None:
            stop.set()

        with _signal(handler):
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


def _job_status(args: argparse.Namespace) -> int:
    escrow = escrow_from(args)
    fetch_dir = Path(args.fetch) if args.fetch else None
    try:
        ledger = _open_ledger(args, escrow)
    except LedgerLocked as exc:
        if fetch_dir is not None:
            raise
        _note(f"{exc}: showing the ledger as it stands (read-only)")
        ledger = _open_ledger(args, escrow, lock=False)
    try:
        written: list[Path] = []
        if fetch_dir is not None:
            runner, _ = _open_runner(args, None, ledger, escrow)
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
                str(r["settle_by"]),
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


def _job_export(args: argparse.Namespace) -> int:
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    from client.models.zoo.silero_vad import export_silero_vad

    model = export_silero_vad(batch=args.batch, chunks=args.chunks)
    out = Path(args.out)
    envelope = model.example_envelope()
    out.write_bytes(encode_envelope(envelope))
    inputs_out = (
        Path(args.inputs_out) if args.inputs_out else out.with_suffix(".inputs.safetensors")
    )
    named = model.signature.bind_inputs(list(model.example_inputs))
    inputs_out.write_bytes(encode_arrays(named))
    summary = {
        "program": str(out),
        "inputs": str(inputs_out),
        "program_bytes": len(envelope.program),
        "weights_bytes": len(envelope.weights or b""),
        "inputs_names": {s.key: s.describe() for s in model.signature.inputs},
        "outputs": [s.describe() for s in model.signature.outputs],
    }
    if args.json:
        emit_json(summary)
        return 0
    print(
        f"wrote {out} (program {len(envelope.program):,} B, "
        f"weights {len(envelope.weights or b''):,} B)"
    )
    print(f"wrote {inputs_out} (example inputs)")
    print_table(["tensor", "input"], [[s.key, s.describe()] for s in model.signature.inputs])
    return 0


def _add_deal_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--deal", type=positive_int, required=True, help="the deal's id on chain")
    parser.add_argument("--provider-url", default=None, help="default: looked up on the market")
    parser.add_argument(
        "--state-dir",
        default=None,
        help=f"deal ledgers (env {STATE_ENV}, default ~/.tpumarket/client)",
    )
    parser.add_argument(
        "--from-block",
        type=int,
        default=int(os.environ.get(FROM_BLOCK_ENV) or 0),
        help=f"the escrow's deployment block: no log is read below it (env {FROM_BLOCK_ENV})",
    )


def _fraction(text: str) -> float:
    value = float(text)
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"must be between 0 and 1: {text!r}")
    return value


def register(commands: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add `tpumarket job ...`."""
    job = commands.add_parser("job", help="run batches of tasks on a deal; export models")
    actions = job.add_subparsers(dest="action", required=True)
    common = common_options()

    run = actions.add_parser("run", parents=[common], help="run tasks from files on a deal")
    _add_deal_options(run)
    run.add_argument("--program", required=True, help="program envelope file (job export)")
    run.add_argument("--inputs", nargs="*", default=[], help="one inference task per file")
    run.add_argument(
        "--compile",
        nargs="*",
        default=[],
        metavar="TARGET",
        help="compile for these targets (local, v5e:1x1)",
    )
    run.add_argument(
        "--max-price",
        type=parse_amount,
        default=None,
        help="tokens per task, at most (default: the plan's price)",
    )
    run.add_argument(
        "--cap",
        type=parse_amount,
        default=None,
        help="spend at most this much in the deal (default: its locked maximum)",
    )
    run.add_argument("--concurrency", type=positive_int, default=4, help="tasks in flight")
    run.add_argument("--wait-s", type=float, default=30.0, help="long-poll per fetch, seconds")
    run.add_argument(
        "--grace-s",
        type=float,
        default=5.0,
        help="how long past its deadline a delivery is awaited (provider restarts)",
    )
    run.add_argument(
        "--spot-check", type=_fraction, default=0.0, help="fraction of inference re-run locally"
    )
    run.add_argument("--out", default=None, help="write verified outputs into this folder")
    run.add_argument(
        "--wait-refunds", action="store_true", help="wait to refund breached tasks on chain"
    )
    run.set_defaults(handler=guarded(_job_run))

    status = actions.add_parser(
        "status", parents=[common], help="a deal's tasks with their state on chain"
    )
    _add_deal_options(status)
    status.add_argument(
        "--fetch",
        default=None,
        metavar="DIR",
        help="fetch, verify and pay results not collected yet; write every result into DIR",
    )
    status.set_defaults(handler=guarded(_job_status))

    watch = actions.add_parser(
        "watch", parents=[common], help="dispute the provider's claims of undelivered work"
    )
    _add_deal_options(watch)
    watch.add_argument("--follow", action="store_true", help="keep watching until the deal closes")
    watch.add_argument("--interval", type=float, default=15.0, help="seconds between looks")
    watch.set_defaults(handler=guarded(_job_watch))

    refund = actions.add_parser("refund", parents=[common], help="refund a deal's breached tasks")
    _add_deal_options(refund)
    refund.add_argument("--wait", action="store_true", help="wait until every pending one is due")
    refund.set_defaults(handler=guarded(_job_refund))

    export = actions.add_parser("export", help="write the zoo's silero-vad as a program file")
    export.add_argument("model", choices=["silero-vad"], help="model of the zoo")
    export.add_argument("--out", required=True, help="program envelope file to write")
    export.add_argument("--inputs-out", default=None, help="example inputs (safetensors)")
    export.add_argument("--batch", type=positive_int, default=4, help="clips per example")
    export.add_argument("--chunks", type=positive_int, default=32, help="32 ms chunks per clip")
    export.add_argument("--json", action="store_true", help="print one JSON object")
    export.set_defaults(handler=guarded(_job_export))
    extend_export(export)  # --from torchax|torch-xla FILE.py:FACTORY (client.export_cli)
