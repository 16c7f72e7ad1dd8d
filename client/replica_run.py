"""`tpumarket job run --replica-deal B`: every input runs on two deals, the outputs are compared.

Refereed delegation from the command line (``client.replicas`` is the SDK underneath). Every
inference input is sent to the provider of ``--deal`` and to the provider of ``--replica-deal``
(a second deal naming the same arbiter), both deliveries are verified as usual, and the two
outputs are compared within the tolerance the arbiter publishes (``--arbiter-url`` is
required: its tolerance is the comparison, its ruling the settlement):

- **agree**: both deliveries are paid by each deal's voucher. Both providers did the work and
  each holds a receipt it could claim on chain, so paying both is what the protocol owes; the
  second payment buys the cross-check.
- **disagree**: the task is held back from both vouchers (``JobRunner.hold_back``, recorded in
  each ledger), so neither is paid by the client's signature. Each provider then claims its
  receipt; the claims are disputed and the program handed to the arbiter
  (``ReplicaReferee``), whose re-execution decides which replica is paid and which claim is
  refunded with the penalty. One line per disagreeing input says where that stands; the
  command exits 1 while any ruling is not in (``--wait-rulings`` waits for them instead:
  the providers claim near each task's settlement instant), and rerunning it with the same
  inputs resumes the tasks (nothing is sent or paid twice) and follows the disputes on.
- **one replica only** (the other undelivered, rejected or failed): the delivery that verified
  is paid as any verified delivery, the other follows the usual refund path; the summary
  names the input as unconfirmed.
"""

from __future__ import annotations

import argparse
import threading
from dataclasses import dataclass, field

from client.amounts import tokens
from client.cli import UsageError, emit_json, note
from client.deal_cli import resolve_deal
from client.errors import ClientError
from client.job_cap import fit_under_cap
from client.job_deal import deal_and_ledger, open_runner, start_block
from client.job_results import TaskResult
from client.job_run import _priced, _tasks
from client.job_status import refund_breaches
from client.jobs import JobRunner
from client.replicas import Replica, ReplicaReferee, arbiter_tolerance, compare_replicas
from contracts.binding import DEAL_OPEN
from contracts.evidence import Tolerance
from programs.envelope import encode_envelope

RULED_PAID = "paid by the arbiter's ruling"
RULED_REFUNDED = "refunded by the arbiter's ruling"
RULING_POLL_S = 2.0
"""How often ``--wait-rulings`` looks for the providers' claims and the arbiter's rulings."""


@dataclass
class Pair:
    """One input's two replicas and what their comparison came to."""

    label: str
    first: TaskResult
    second: TaskResult
    verdict: str = "none"  # agree, disagree, unconfirmed, none
    difference: str | None = None
    rulings: list[str] = field(default_factory=list)  # per replica: paid, refunded, ...


def compare_pairs(
    pairs: list[Pair], deals: tuple[int, int], tolerance: Tolerance
) -> list[tuple[Pair, Replica, Replica]]:
    """Set each pair's verdict; return the disagreeing ones with their two replicas."""
    disagreeing = []
    for pair in pairs:
        a, b = pair.first.outcome, pair.second.outcome
        ok_a = bool(a and a.succeeded and a.view and a.view.outputs is not None)
        ok_b = bool(b and b.succeeded and b.view and b.view.outputs is not None)
        if not (ok_a and ok_b):
            pair.verdict = "unconfirmed" if ok_a or ok_b else "none"
            continue
        assert a is not None and b is not None and a.view and b.view
        replicas = (
            Replica(deals[0], a.index, a.view.outputs or b""),
            Replica(deals[1], b.index, b.view.outputs or b""),
        )
        comparison = compare_replicas(replicas, tolerance)
        if comparison.agree:
            pair.verdict = "agree"
        else:
            pair.verdict, pair.difference = "disagree", comparison.differences[1]
            disagreeing.append((pair, *replicas))
    return disagreeing


def referee_step(
    referee: ReplicaReferee, replica: Replica, envelope: bytes, handed: set[tuple[int, int]]
) -> str:
    """Dispute the replica's claim, hand the arbiter the program (once: ``handed`` keeps the
    replicas it holds); return where the replica stands."""
    batch = referee.dispute(replica)
    if batch is None:
        return "not claimed yet"
    ruled = referee.outcome(replica, batch)
    if ruled is not None:
        return RULED_PAID if ruled else RULED_REFUNDED
    key = (replica.deal_id, replica.task_index)
    if key not in handed:
        if not referee.hand_over(replica, batch, envelope):
            return f"batch {batch} disputed, the arbiter has not taken it yet"
        handed.add(key)
    return f"batch {batch} disputed, awaiting the arbiter's ruling"


def job_run_replicated(args: argparse.Namespace) -> int:
    """Run every input on ``--deal`` and ``--replica-deal``; pay agreement, referee the rest."""
    if not args.arbiter_url:
        raise UsageError(
            "--replica-deal needs --arbiter-url: the arbiter's tolerance compares the replicas "
            "and its ruling settles a disagreement"
        )
    if args.compile:
        raise UsageError("--replica-deal replicates inference tasks only (no --compile)")
    files = _tasks(args)
    tolerance = arbiter_tolerance(args.arbiter_url)
    second = argparse.Namespace(**vars(args))
    second.deal = resolve_deal(args, args.replica_deal)
    second.provider_url = args.replica_provider_url
    if second.deal == args.deal:
        raise UsageError("--replica-deal must name another deal than --deal")
    with deal_and_ledger(args) as (escrow, ledger_a), deal_and_ledger(second) as (_, ledger_b):
        runners: list[JobRunner] = []
        caps: list[int] = []
        for deal_args, ledger in ((args, ledger_a), (second, ledger_b)):
            runner, cap = open_runner(deal_args, args.cap, ledger, escrow)
            if escrow.get_deal(deal_args.deal).status != DEAL_OPEN:
                raise ClientError(f"deal {deal_args.deal} is not open")
            runners.append(runner)
            caps.append(cap)
        deal_a, deal_b = (escrow.get_deal(d) for d in (args.deal, second.deal))
        if deal_a.arbiter.lower() != deal_b.arbiter.lower():
            raise ClientError(
                f"deals {args.deal} and {second.deal} name different arbiters: one ruling "
                "cannot settle their replicas"
            )
        plans = []
        for runner, cap in zip(runners, caps, strict=True):
            tasks = _priced(args, files, runner.session.plan)
            plans.append(fit_under_cap(tasks, owed=runner.session.book.total, cap=cap))
        common = {t.label for t in plans[0].run} & {t.label for t in plans[1].run}
        note(
            f"replicas: {len(common)} input(s) on deals {args.deal} and {second.deal}, "
            f"compared within the arbiter's tolerance"
        )
        out: list[list[TaskResult]] = [[], []]

        def run(i: int) -> None:
            plan = plans[i]
            keep = tuple(t for t in plan.run if t.label in common)
            out[i] = runners[i].run(
                type(plan)(plan.cap, plan.owed, keep, ()),
                concurrency=args.concurrency,
                wait_s=args.wait_s,
            )

        thread = threading.Thread(target=run, args=(1,), name="replica-run", daemon=True)
        thread.start()
        run(0)
        thread.join()
        by_label = {r.task.label: r for r in out[1]}
        pairs = [Pair(r.task.label, r, by_label[r.task.label]) for r in out[0]]
        disagreeing = compare_pairs(pairs, (args.deal, second.deal), tolerance)
        for pair, *_ in disagreeing:
            for runner, result in ((runners[0], pair.first), (runners[1], pair.second)):
                assert result.outcome is not None
                runner.hold_back(result.outcome.index, f"replicas disagree ({pair.difference})")
        for runner in runners:
            runner.pay()
        for runner in runners:
            refund_breaches(runner, False)
            runner.watch()
            runner.finish()
        referee = ReplicaReferee(
            account=runners[0].session.account,
            arbiter_url=args.arbiter_url,
            from_block=start_block(args),
            say=note,
        )
        for pair, first, second_replica in disagreeing:
            note(
                f"replicas disagree on {pair.label} (deal {first.deal_id} task "
                f"{first.task_index}, deal {second_replica.deal_id} task "
                f"{second_replica.task_index}): {pair.difference}; held back from both "
                "vouchers, their claims go to the arbiter"
            )
        handed: set[tuple[int, int]] = set()
        while True:
            undecided = 0
            for pair, first, second_replica in disagreeing:
                assert pair.first.outcome is not None
                envelope = encode_envelope(pair.first.outcome.spec.envelope)
                pair.rulings = [
                    referee_step(referee, r, envelope, handed) for r in (first, second_replica)
                ]
                undecided += any(r not in (RULED_PAID, RULED_REFUNDED) for r in pair.rulings)
            if not undecided or not args.wait_rulings:
                break
            threading.Event().wait(RULING_POLL_S)
        for pair, first, second_replica in disagreeing:
            note(
                f"replicas of {pair.label}: deal {first.deal_id} task {first.task_index} "
                f"{pair.rulings[0]}; deal {second_replica.deal_id} task "
                f"{second_replica.task_index} {pair.rulings[1]}"
            )
    return _report(args, second.deal, pairs, runners, undecided)


def _report(
    args: argparse.Namespace,
    replica_deal: int,
    pairs: list[Pair],
    runners: list[JobRunner],
    undecided: int,
) -> int:
    verdicts = [p.verdict for p in pairs]
    totals = [r.session.book.last_signed for r in runners]
    errors = [r.voucher_error for r in runners if r.voucher_error]
    summary = {
        "deal_id": args.deal,
        "replica_deal_id": replica_deal,
        "inputs": len(pairs),
        "agree": verdicts.count("agree"),
        "disagree": verdicts.count("disagree"),
        "unconfirmed": verdicts.count("unconfirmed"),
        "undelivered": verdicts.count("none"),
        "undecided": undecided,
        "voucher_totals": totals,
        "voucher_errors": errors,
    }
    rows = [
        {
            "input": p.label,
            "verdict": p.verdict,
            "tasks": [p.first.index, p.second.index],
            "states": [p.first.state, p.second.state],
            "difference": p.difference,
            "rulings": p.rulings,
        }
        for p in pairs
    ]
    if args.json:
        emit_json({"summary": summary, "inputs": rows})
    else:
        for row in rows:
            print(f"{row['input']}: {row['verdict']} (tasks {row['tasks']}, {row['states']})")
        shown = ", ".join(tokens(t) for t in totals)
        print(f"voucher totals (deal {args.deal}, deal {replica_deal}): {shown}")
    for error in errors:
        note(f"error: voucher: {error}")
    bad = undecided or "none" in verdicts or errors
    if undecided:
        note(
            f"error: {undecided} disagreeing input(s) not decided yet: rerun the same command "
            "to follow the disputes until the arbiter rules"
        )
    return 1 if bad else 0
