"""`tpumarket job ...`: run batches of compile and inference tasks on a deal; export models.

- ``job run``: submit tasks read from files to the deal's provider (bounded concurrency),
  verify every delivery, pay verified ones with a cumulative voucher, refund breaches on
  chain. Before sending, the batch is fitted under the cap (the deal's locked maximum, or a
  lower ``--cap``) at each task's maximum price: the projected bill is printed, a warning is
  given as it nears the cap, and tasks that could pass it are not sent.
- ``job refund``: refund the deal's pending breached tasks (from earlier runs) on chain.
- ``job export``: write a model of the zoo as a program envelope and an example inputs file.

A run keeps the deal's ledger (``client.ledger``) under ``--state-dir``, so a later run signs
vouchers that stay cumulative and never reuses a task index. Registered by
``client.cli.register`` beside ``tpumarket client``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
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
from client.errors import ClientError
from client.jobs import (
    JobRunner,
    TaskResult,
    compile_tasks,
    default_max_price,
    fit_under_cap,
    inference_tasks,
    read_envelope,
    save_outputs,
)
from client.ledger import DealLedger
from client.market_http import MarketHttp
from client.provider_http import ProviderHttp
from client.session import DealSession
from client.vouchers import VoucherBook
from contracts.binding import DEAL_OPEN, Chain, Escrow
from contracts.messages import KIND_COMPILE, KIND_INFERENCE, Plan
from contracts.program import encode_arrays, encode_envelope

STATE_ENV = "TPUMARKET_CLIENT_STATE"


def _state_dir(args: argparse.Namespace) -> Path:
    if args.state_dir is not None:
        return Path(args.state_dir)
    return Path(os.environ.get(STATE_ENV) or Path.home() / ".tpumarket" / "client")


def _chain_now(escrow: Escrow) -> int:
    """Return the chain's time as far as it can be known: its latest block, or later."""
    latest = int(escrow.tx.w3.eth.get_block("latest")["timestamp"])
    return max(latest, int(time.time()))


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


def _open_runner(args: argparse.Namespace, cap: int | None) -> tuple[JobRunner, int]:
    """Check the deal and the provider's terms against the chain; resume the deal's ledger."""
    key = key_from(args)
    escrow = escrow_from(args)
    account = ClientAccount(escrow, Chain(args.rpc_url).token(escrow.token()), key)
    deal = escrow.get_deal(args.deal)
    if deal.client.lower() != account.address.lower():
        raise ClientError(f"deal {args.deal} belongs to {deal.client}, not to {account.address}")
    if deal.status != DEAL_OPEN:
        raise ClientError(f"deal {args.deal} is not open")
    provider = ProviderHttp(_provider_url(args, deal.provider), client_key=key)
    info = provider.info()
    plan = Plan.from_json(info["plan"])
    if str(info.get("provider", "")).lower() != deal.provider.lower():
        raise ClientError(f"that endpoint serves {info.get('provider')}, not {deal.provider}")
    if plan.struct_hash() != deal.plan_hash:
        raise ClientError("the provider's plan is not the plan the deal was opened with")
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
    )
    ledger = DealLedger.open(_state_dir(args), escrow.domain.chain_id, escrow.address, args.deal)
    return JobRunner.resume(session, ledger), deal_cap


def _warn(message: str) -> None:
    print(f"warning: {message}", file=sys.stderr, flush=True)


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


def _job_run(args: argparse.Namespace) -> int:
    runner, cap = _open_runner(args, args.cap)
    session = runner.session
    tasks = _tasks(args, session.plan)
    plan = fit_under_cap(tasks, owed=session.book.total, cap=cap)
    print(
        f"deal {args.deal}: {len(plan.run)} task(s), projected bill {tokens(plan.projected)} "
        f"of cap {tokens(cap)} ({tokens(plan.owed)} already owed)",
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

    results = runner.run(
        plan, concurrency=args.concurrency, wait_s=args.wait_s, on_done=done if plan.run else None
    )
    voucher = runner.pay()
    refunds = _refund(runner, args.wait_refunds)
    written = save_outputs(results, Path(args.out)) if args.out else []
    return _report(
        args, runner, results, voucher.cumulative_amount if voucher else None, refunds, cap, written
    )


def _refund(runner: JobRunner, wait: bool) -> list[tuple[int, int, int]]:
    escrow = runner.session.account.escrow
    refunds = runner.refund_due(_chain_now(escrow))
    pending = len(runner.ledger.pending)
    progress = Progress("refunds", pending) if wait and pending else None
    for index, _, _ in refunds:
        if progress:
            progress.step(f"task {index} refunded")
    while wait and runner.ledger.pending:
        due = runner.next_refund_at()
        assert due is not None
        time.sleep(
            max(0.5, min(5.0, due - _chain_now(escrow)))
        )  # until the chain's clock passes it
        for index, _, _ in (more := runner.refund_due(_chain_now(escrow))):
            if progress:
                progress.step(f"task {index} refunded")
        refunds += more
    return refunds


def _report(
    args: argparse.Namespace,
    runner: JobRunner,
    results: list[TaskResult],
    voucher: int | None,
    refunds: list[tuple[int, int, int]],
    cap: int,
    written: list[Path],
) -> int:
    book, ledger = runner.session.book, runner.ledger
    states = [r.state for r in results]
    summary = {
        "deal_id": args.deal,
        "tasks_sent": sum(r.outcome is not None for r in results),
        "tasks_paid": states.count("paid"),
        "failures_diagnosed": sum(s.startswith("failed") for s in states),
        "tasks_rejected": states.count("rejected") + states.count("undelivered"),
        "tasks_refunded": len(refunds),
        "tasks_skipped": states.count("skipped"),
        "tasks_errored": states.count("error"),
        "spent": sum(r.amount for r in results),
        "voucher_total": book.last_signed,
        "voucher_signed": voucher is not None,
        "refunded": sum(r for _, r, _ in refunds),
        "penalties": sum(p for _, _, p in refunds),
        "pending_refunds": sorted(ledger.pending),
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
            ["tasks sent", str(summary["tasks_sent"])],
            ["paid", str(summary["tasks_paid"])],
            ["failed, diagnosed (billed by the plan)", str(summary["failures_diagnosed"])],
            ["not paid (rejected or undelivered)", str(summary["tasks_rejected"])],
            [
                "refunded on chain",
                f"{len(refunds)}: {tokens(summary['refunded'])} back, "
                f"penalties {tokens(summary['penalties'])}",
            ],
            ["not sent (cap)", str(summary["tasks_skipped"])],
            ["spent this run", tokens(summary["spent"])],
            ["voucher total (deal)", f"{tokens(book.last_signed)} of cap {tokens(cap)}"],
            ["refunds pending", ", ".join(map(str, summary["pending_refunds"])) or "none"],
        ],
    )
    for path in written:
        print(f"wrote {path}")
    return 0


def _job_refund(args: argparse.Namespace) -> int:
    runner, _ = _open_runner(args, None)
    refunds = _refund(runner, args.wait)
    pending = sorted(runner.ledger.pending)
    if args.json:
        emit_json(
            {
                "deal_id": args.deal,
                "refunds": [{"index": i, "refund": r, "penalty": p} for i, r, p in refunds],
                "pending_refunds": pending,
            }
        )
        return 0
    if refunds:
        print_table(
            ["task", "refund", "penalty"], [[str(i), tokens(r), tokens(p)] for i, r, p in refunds]
        )
    print(f"pending refunds: {', '.join(map(str, pending)) or 'none'}")
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
        "--spot-check", type=_fraction, default=0.0, help="fraction of inference re-run locally"
    )
    run.add_argument("--out", default=None, help="write verified outputs into this folder")
    run.add_argument(
        "--wait-refunds", action="store_true", help="wait to refund breached tasks on chain"
    )
    run.set_defaults(handler=guarded(_job_run))

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
