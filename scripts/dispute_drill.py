"""Dispute drill: every dispute case end to end on anvil with a real arbiter process.

Each case opens a deal on a fresh escrow state, claims one task whose program is a real model
(the honest outputs come from the provider's sandbox), disputes the claim and hands over the
evidence each party chooses to give; the arbiter (``python -m provider.arbiter.cli run``)
re-executes and rules on chain. The drill reads the outcome back from the chain and checks it
against the case's right answer, the escrow's money invariant after each case, and that every
dispute was ruled (none lapsed). The last line of stdout is one JSON object.

    scripts/dispute-drill
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from client.accounts import ClientAccount  # noqa: E402
from client.replicas import (  # noqa: E402
    Replica,
    ReplicaReferee,
    arbiter_tolerance,
    compare_replicas,
)
from contracts.binding import BATCH_PAID, BATCH_REJECTED  # noqa: E402
from contracts.chain import Anvil  # noqa: E402
from contracts.evidence import Role  # noqa: E402
from contracts.messages import address_of  # noqa: E402
from programs.envelope import encode_arrays  # noqa: E402
from tests.arbiter.drill import (  # noqa: E402
    EVIDENCE_WINDOW_S,
    PENALTY,
    ArbiterProcess,
    Job,
    altered,
    conserved,
    dispute,
    make_job,
    send,
    signed_delivery,
)
from tests.contracts.builders import claim, open_deal  # noqa: E402
from tests.contracts.conftest import World, deploy_world  # noqa: E402
from tests.polling import wait_until  # noqa: E402

Outcome = list[tuple[int, bool]]
"""(deal, whether the provider should win) per disputed batch of a case."""
Case = Callable[[World, ArbiterProcess, Job], Outcome]
"""A case: set up, dispute and hand over the evidence each party chooses to give."""


def honest_delivery_disputed(
    world: World, arbiter: ArbiterProcess, job: Job
) -> list[tuple[int, bool]]:
    deal, _ = dispute(world, arbiter, job, job.outputs)
    send(world, arbiter, deal, Role.CLIENT_PROGRAM, job.envelope, world.clients[0])
    send(world, arbiter, deal, Role.PROVIDER_OUTPUTS, job.outputs, world.providers[0])
    return [(deal, True)]


def provider_alters_outputs(
    world: World, arbiter: ArbiterProcess, job: Job
) -> list[tuple[int, bool]]:
    wrong = altered(job.outputs)
    deal, _ = dispute(world, arbiter, job, wrong)
    send(world, arbiter, deal, Role.CLIENT_PROGRAM, job.envelope, world.clients[0])
    send(world, arbiter, deal, Role.PROVIDER_OUTPUTS, wrong, world.providers[0])
    return [(deal, False)]


def provider_fabricates_receipt(
    world: World, arbiter: ArbiterProcess, job: Job
) -> list[tuple[int, bool]]:
    # Outputs it never computed: arrays of the right names, made up, receipted and uploaded.
    made_up = encode_arrays({"0": np.zeros((4, 10), np.float32)})
    deal, _ = dispute(world, arbiter, job, made_up)
    send(world, arbiter, deal, Role.CLIENT_PROGRAM, job.envelope, world.clients[0])
    send(world, arbiter, deal, Role.PROVIDER_OUTPUTS, made_up, world.providers[0])
    return [(deal, False)]


def provider_never_delivered(
    world: World, arbiter: ArbiterProcess, job: Job
) -> list[tuple[int, bool]]:
    deal, _ = dispute(world, arbiter, job, job.outputs)
    send(world, arbiter, deal, Role.CLIENT_PROGRAM, job.envelope, world.clients[0])
    world.anvil.increase_time(EVIDENCE_WINDOW_S + 1)
    return [(deal, False)]


def client_never_answers(world: World, arbiter: ArbiterProcess, job: Job) -> Outcome:
    deal, _ = dispute(world, arbiter, job, job.outputs)
    send(world, arbiter, deal, Role.PROVIDER_OUTPUTS, job.outputs, world.providers[0])
    world.anvil.increase_time(EVIDENCE_WINDOW_S + 1)
    return [(deal, True)]


def replicas_disagree(world: World, arbiter: ArbiterProcess, job: Job) -> Outcome:
    # The same task on two providers (client.replicas): their outputs differ beyond the
    # arbiter's tolerance, so neither is vouched; each claims, the SDK's referee disputes both
    # claims and hands over the program: the arbiter's re-execution says which one is paid.
    client = world.clients[0]
    start = int(world.escrow.tx.w3.eth.block_number)
    replicas = []
    for index, outputs in ((0, job.outputs), (1, altered(job.outputs))):
        provider = world.providers[index]
        deal, _ = open_deal(world, client, provider, penalty=PENALTY)
        claim(
            world, provider, deal, [signed_delivery(world, deal, 0, job, outputs, client, provider)]
        )
        replicas.append(Replica(deal, 0, outputs))
    if compare_replicas(replicas, arbiter_tolerance(arbiter.url)).agree:
        raise AssertionError("the altered replica agrees with the honest one")
    account = ClientAccount(world.escrow, world.token, client, arbiters=None)
    referee = ReplicaReferee(account=account, arbiter_url=arbiter.url, from_block=start)
    for index, replica in enumerate(replicas):
        batch = referee.dispute(replica)
        assert batch == 0
        wait_until(partial(referee.hand_over, replica, 0, job.envelope), 60, "the program")
        send(
            world,
            arbiter,
            replica.deal_id,
            Role.PROVIDER_OUTPUTS,
            replica.outputs,
            world.providers[index],
        )
    return [(replicas[0].deal_id, True), (replicas[1].deal_id, False)]


ARBITER_FEE = 20_000
"""The fee the arbiter charges in the fee case (base units)."""


def fee_paid_by_the_loser(world: World, arbiter: ArbiterProcess, job: Job) -> Outcome:
    # With a fee: the client that disputes a correct delivery pays it from what its dispute
    # held; the provider whose outputs are altered pays it from the deal's stake.
    escrow, client = world.escrow, world.clients[0]
    escrow.set_arbiter_fee(world.arbiter, ARBITER_FEE)
    escrow.deposit(client, 2 * ARBITER_FEE)  # each dispute holds one fee
    try:
        right, _ = dispute(world, arbiter, job, job.outputs)
        wrong_outputs = altered(job.outputs)
        wrong, _ = dispute(world, arbiter, job, wrong_outputs)
    finally:
        escrow.set_arbiter_fee(world.arbiter, 0)
    before = escrow.balance_of(address_of(world.arbiter))
    for deal, outputs in ((right, job.outputs), (wrong, wrong_outputs)):
        send(world, arbiter, deal, Role.CLIENT_PROGRAM, job.envelope, client)
        send(world, arbiter, deal, Role.PROVIDER_OUTPUTS, outputs, world.providers[0])
    for deal in (right, wrong):
        wait_until(partial(has_ruling, arbiter, deal), 300, "a ruling")
    paid = escrow.balance_of(address_of(world.arbiter)) - before
    if paid != 2 * ARBITER_FEE:
        raise AssertionError(f"the arbiter was paid {paid}, not two fees of {ARBITER_FEE}")
    return [(right, True), (wrong, False)]


def arbiter_killed_mid_case(
    world: World, arbiter: ArbiterProcess, job: Job
) -> list[tuple[int, bool]]:
    deal, _ = dispute(world, arbiter, job, job.outputs)
    send(world, arbiter, deal, Role.PROVIDER_OUTPUTS, job.outputs, world.providers[0])
    arbiter.kill()
    arbiter.start()  # its journal holds the case and the provider's evidence
    send(world, arbiter, deal, Role.CLIENT_PROGRAM, job.envelope, world.clients[0])
    return [(deal, True)]


def has_ruling(arbiter: ArbiterProcess, deal: int) -> bool:
    """Whether the arbiter's ruling on the deal's batch 0 is on chain."""
    return arbiter.ruling(deal, 0) is not None


CASES: list[Case] = [
    honest_delivery_disputed,
    provider_alters_outputs,
    provider_fabricates_receipt,
    provider_never_delivered,
    client_never_answers,
    replicas_disagree,
    fee_paid_by_the_loser,
    arbiter_killed_mid_case,
]


def main() -> None:
    """Run every case; print the figures as one JSON line."""
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    job = make_job()
    results: list[dict[str, Any]] = []
    ruling_s: list[float] = []
    with Anvil.start(accounts=10) as anvil, tempfile.TemporaryDirectory() as tmp:
        world = deploy_world(anvil)
        arbiter = ArbiterProcess(world, Path(tmp) / "arbiter")
        arbiter.start()
        try:
            for case in CASES:
                started = time.monotonic()
                outcome = case(world, arbiter, job)
                for deal, _ in outcome:
                    wait_until(partial(has_ruling, arbiter, deal), 300, "a ruling")
                    ruling_s.append(time.monotonic() - started)
                # Read once every ruling of the case is mined: no transaction of the arbiter
                # lands between the reads the invariant adds up.
                invariant = conserved(world)
                for deal, provider_should_win in outcome:
                    batch = world.escrow.get_batch(deal, 0)
                    provider_won = batch.status == BATCH_PAID
                    results.append(
                        {
                            "case": case.__name__,
                            "deal": deal,
                            "provider_should_win": provider_should_win,
                            "provider_won": provider_won,
                            "correct": provider_won == provider_should_win,
                            "lapsed": batch.status not in (BATCH_PAID, BATCH_REJECTED),
                            "invariant_ok": invariant,
                        }
                    )
        finally:
            arbiter.stop()
    # The honest party of each case is the one that should win: a wrong ruling is its loss.
    honest_losses = sum(1 for r in results if not r["correct"])
    figures = {
        "rulings_total": len(results),
        "rulings_correct": sum(1 for r in results if r["correct"]),
        "disputes_lapsed": sum(1 for r in results if r["lapsed"]),
        "invariant_ok": all(r["invariant_ok"] for r in results),
        "honest_losses": honest_losses,
        "ruling_s_p50": round(statistics.median(ruling_s), 2) if ruling_s else None,
        "penalty_per_task": PENALTY,
        "cases": results,
    }
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
