"""`tpumarket job ...`: run batches of compile and inference tasks on a deal; export models.

- ``job run`` (``client.job_run``): submit tasks read from files to the deal's provider, verify
  every delivery, pay verified ones with a cumulative voucher, refund breaches on chain, judge
  the provider's claims.
- ``job status``, ``job watch``, ``job refund`` (``client.job_status``): a deal's tasks with
  their state on chain (``--fetch`` collects a crashed run's results), its provider's claims,
  its breached tasks' refunds.
- ``job export``: write a model of the zoo as a program envelope and an example inputs file.

``--deal`` takes the deal's id on chain (``7``) or the market's (``cpu:1``). A run keeps the
deal's ledger (``client.ledger``) under ``--state-dir``, so a later run signs vouchers that stay
cumulative and never reuses a task index; one process at a time holds a deal (a second ``job
run`` on it fails at once). Registered by ``client.cli.register`` beside ``tpumarket client``.
"""

from __future__ import annotations

import argparse
import os

from client.cli import common_options, guarded, parse_amount, positive_int
from client.deal_cli import STATE_ENV
from client.export_cli import extend as extend_export
from client.export_cli import write_program
from client.job_deal import with_deal
from client.job_run import job_run
from client.job_status import job_refund, job_status, job_watch
from client.replica_run import job_run_replicated

FROM_BLOCK_ENV = "TPUMARKET_ESCROW_BLOCK"


ARBITER_URL_ENV = "TPUMARKET_ARBITER_URL"


def _job_export(args: argparse.Namespace) -> int:
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    from client.models.zoo.silero_vad import export_silero_vad

    model = export_silero_vad(batch=args.batch, chunks=args.chunks)
    return write_program(args, model, None)


def _job_run(args: argparse.Namespace) -> int:
    if args.replica_deal is not None:
        return job_run_replicated(args)
    return job_run(args)


def _add_deal_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--deal", required=True, help="the deal's id on chain (7) or on the market (cpu:1)"
    )
    parser.add_argument("--provider-url", default=None, help="default: looked up on the market")
    parser.add_argument(
        "--state-dir",
        default=None,
        help=f"deal ledgers (env {STATE_ENV}, default ~/.tpumarket/client)",
    )
    parser.add_argument(
        "--from-block",
        type=int,
        default=None,
        help=f"the escrow's deployment block: no log is read below it (env {FROM_BLOCK_ENV})",
    )
    parser.add_argument(
        "--arbiter-url",
        default=os.environ.get(ARBITER_URL_ENV),
        help="the deal's arbiter: programs are kept as sent and handed to it when a claim is "
        f"disputed (env {ARBITER_URL_ENV}; without it a disputed task's program is not sent)",
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
    run.add_argument(
        "--replica-deal",
        default=None,
        help="also run every input on this second deal (same arbiter) and compare the outputs "
        "within the arbiter's tolerance: disagreeing ones are paid by neither voucher and go "
        "to the arbiter (needs --arbiter-url; client.replica_run)",
    )
    run.add_argument(
        "--replica-provider-url", default=None, help="the replica deal's provider endpoint"
    )
    run.add_argument(
        "--wait-rulings",
        action="store_true",
        help="with --replica-deal: wait until the arbiter has ruled every disagreement",
    )
    run.set_defaults(handler=guarded(with_deal(_job_run)))

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
    status.set_defaults(handler=guarded(with_deal(job_status)))

    watch = actions.add_parser(
        "watch", parents=[common], help="dispute the provider's claims of undelivered work"
    )
    _add_deal_options(watch)
    watch.add_argument("--follow", action="store_true", help="keep watching until the deal closes")
    watch.add_argument("--interval", type=float, default=15.0, help="seconds between looks")
    watch.set_defaults(handler=guarded(with_deal(job_watch)))

    refund = actions.add_parser("refund", parents=[common], help="refund a deal's breached tasks")
    _add_deal_options(refund)
    refund.add_argument("--wait", action="store_true", help="wait until every pending one is due")
    refund.set_defaults(handler=guarded(with_deal(job_refund)))

    export = actions.add_parser("export", help="write the zoo's silero-vad as a program file")
    export.add_argument("model", choices=["silero-vad"], help="model of the zoo")
    export.add_argument("--out", required=True, help="program envelope file to write")
    export.add_argument("--inputs-out", default=None, help="example inputs (safetensors)")
    export.add_argument("--batch", type=positive_int, default=4, help="clips per example")
    export.add_argument("--chunks", type=positive_int, default=32, help="32 ms chunks per clip")
    export.add_argument("--json", action="store_true", help="print one JSON object")
    export.set_defaults(handler=guarded(_job_export))
    extend_export(export)  # --from torchax|torch-xla FILE.py:FACTORY (client.export_cli)
