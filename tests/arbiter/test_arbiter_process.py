"""The arbiter as a real process against a real escrow: disputes decided by re-execution.

Property (P4 with the arbiter in it): whoever disputes, a batch is paid to the provider exactly
when its receipted outputs are what the client's signed program gives (re-executed here in the
provider's sandbox, within the published tolerance), and refunded with the penalty otherwise; a
party that does not hand its evidence over in time loses; every dispute is ruled before it
could lapse; a restarted arbiter picks its cases up where its journal left them. After each
case the escrow's tokens equal what it owes, to the unit.
"""

from __future__ import annotations

import pytest

from contracts.binding import BATCH_DISPUTED, BATCH_PAID, BATCH_REJECTED
from contracts.evidence import EvidenceUploadError, Role
from contracts.messages import address_of
from tests.contracts.conftest import World

from .drill import (
    EVIDENCE_WINDOW_S,
    PENALTY,
    ArbiterProcess,
    Job,
    altered,
    dispute,
    ruled,
    send,
)


def test_a_client_that_disputes_a_correct_delivery_loses_and_the_provider_is_paid(
    world: World, arbiter: ArbiterProcess, job: Job
) -> None:
    deal_id, task = dispute(world, arbiter, job, job.outputs)
    provider_before = world.escrow.balance_of(address_of(world.providers[0]))
    send(world, arbiter, deal_id, Role.CLIENT_PROGRAM, job.envelope, world.clients[0])
    send(world, arbiter, deal_id, Role.PROVIDER_OUTPUTS, job.outputs, world.providers[0])
    ruling = ruled(world, arbiter, deal_id)
    assert ruling["provider_wins"] is True
    assert ruling["tasks"][0]["verdict"] == "upheld"
    assert world.escrow.get_batch(deal_id, 0).status == BATCH_PAID
    paid = world.escrow.balance_of(address_of(world.providers[0])) - provider_before
    assert paid == task.receipt.amount


def test_a_provider_whose_outputs_are_wrong_loses_and_the_client_gets_the_penalty(
    world: World, arbiter: ArbiterProcess, job: Job
) -> None:
    wrong = altered(job.outputs)
    deal_id, task = dispute(world, arbiter, job, wrong)
    client_before = world.escrow.balance_of(address_of(world.clients[0]))
    send(world, arbiter, deal_id, Role.CLIENT_PROGRAM, job.envelope, world.clients[0])
    send(world, arbiter, deal_id, Role.PROVIDER_OUTPUTS, wrong, world.providers[0])
    ruling = ruled(world, arbiter, deal_id)
    assert ruling["provider_wins"] is False
    assert ruling["tasks"][0]["verdict"] == "outputs_differ"
    assert world.escrow.get_batch(deal_id, 0).status == BATCH_REJECTED
    deal = world.escrow.get_deal(deal_id)
    assert deal.pending == 0
    # The task's price and the penalty are the client's free balance at once.
    refunded = world.escrow.balance_of(address_of(world.clients[0])) - client_before
    assert refunded == task.receipt.amount + PENALTY


def test_a_client_that_never_answers_loses_once_the_evidence_period_is_over(
    world: World, arbiter: ArbiterProcess, job: Job
) -> None:
    deal_id, _ = dispute(world, arbiter, job, job.outputs)
    send(world, arbiter, deal_id, Role.PROVIDER_OUTPUTS, job.outputs, world.providers[0])
    assert arbiter.ruling(deal_id, 0) is None  # the client still has time
    world.anvil.increase_time(EVIDENCE_WINDOW_S + 1)
    ruling = ruled(world, arbiter, deal_id)
    assert ruling["provider_wins"] is True
    assert ruling["tasks"][0]["verdict"] == "program_missing"


def test_a_provider_that_never_delivered_loses_its_claim(
    world: World, arbiter: ArbiterProcess, job: Job
) -> None:
    deal_id, _ = dispute(world, arbiter, job, job.outputs)
    send(world, arbiter, deal_id, Role.CLIENT_PROGRAM, job.envelope, world.clients[0])
    world.anvil.increase_time(EVIDENCE_WINDOW_S + 1)
    ruling = ruled(world, arbiter, deal_id)
    assert ruling["provider_wins"] is False
    assert ruling["tasks"][0]["verdict"] == "outputs_missing"


def test_uploads_from_the_wrong_party_or_with_other_bytes_are_refused(
    world: World, arbiter: ArbiterProcess, job: Job
) -> None:
    deal_id, _ = dispute(world, arbiter, job, job.outputs)
    with pytest.raises(EvidenceUploadError, match="wrong_sender"):
        send(world, arbiter, deal_id, Role.PROVIDER_OUTPUTS, job.outputs, world.stranger)
    with pytest.raises(EvidenceUploadError, match="wrong_sender"):  # the client posing as provider
        send(world, arbiter, deal_id, Role.PROVIDER_OUTPUTS, job.outputs, world.clients[0])
    with pytest.raises(EvidenceUploadError, match="not_receipted"):
        send(
            world,
            arbiter,
            deal_id,
            Role.PROVIDER_OUTPUTS,
            altered(job.outputs),
            world.providers[0],
        )
    with pytest.raises(EvidenceUploadError, match="bad_program"):
        send(world, arbiter, deal_id, Role.CLIENT_PROGRAM, b"not an envelope", world.clients[0])
    case = arbiter.case(deal_id, 0)
    assert case is not None and case["missing"] == {"client": [0], "provider": [0]}
    assert world.escrow.get_batch(deal_id, 0).status == BATCH_DISPUTED


def test_an_arbiter_killed_mid_case_rules_after_a_restart_from_its_journal(
    world: World, arbiter: ArbiterProcess, job: Job
) -> None:
    deal_id, _ = dispute(world, arbiter, job, job.outputs)
    send(world, arbiter, deal_id, Role.PROVIDER_OUTPUTS, job.outputs, world.providers[0])
    arbiter.kill()
    world.anvil.increase_time(EVIDENCE_WINDOW_S + 1)
    arbiter.start()  # same data dir: the case and the provider's evidence are journaled
    ruling = ruled(world, arbiter, deal_id)
    assert ruling["provider_wins"] is True
    assert ruling["tasks"][0]["verdict"] == "program_missing"
