"""The parties' software hands its evidence to the arbiter by itself.

Property: once a client disputes a provider's claim, the provider's job uploads the outputs its
journal holds for every task of the batch to the deal's arbiter, and only to the deal's arbiter.
"""

from __future__ import annotations

from pathlib import Path

from client.accounts import ClientAccount
from client.dispute_evidence import EnvelopeStore, ProgramEvidence
from client.ledger import DealLedger
from client.ledger_records import TaskRecord, TaskState
from client.watch import ClaimWatcher
from contracts.evidence import Role
from provider.dispute_evidence import DisputeEvidence
from tests.contracts.builders import claim, open_deal
from tests.contracts.conftest import World
from tests.polling import wait_until

from .drill import (
    PENALTY,
    ArbiterProcess,
    Job,
    dispute,
    ruled,
    send,
    signed_delivery,
)


def test_the_provider_job_uploads_its_outputs_for_a_disputed_claim(
    world: World, arbiter: ArbiterProcess, job: Job
) -> None:
    start = int(world.escrow.tx.w3.eth.block_number)
    deal_id, task = dispute(world, arbiter, job, job.outputs)
    outputs = {(deal_id, task.index): job.outputs}
    uploader = DisputeEvidence(
        escrow=world.escrow,
        private_key=world.providers[0],
        arbiter_url=arbiter.url,
        outputs=outputs.get,
        start_block=start,
    )
    assert uploader.run() == [(deal_id, 0)]
    case = arbiter.case(deal_id, 0)
    assert case is not None and case["missing"]["provider"] == []
    assert uploader.run() == []  # sent once
    send(world, arbiter, deal_id, Role.CLIENT_PROGRAM, job.envelope, world.clients[0])
    assert ruled(world, arbiter, deal_id)["provider_wins"] is True


def test_another_provider_s_job_uploads_nothing(
    world: World, arbiter: ArbiterProcess, job: Job
) -> None:
    start = int(world.escrow.tx.w3.eth.block_number)
    deal_id, task = dispute(world, arbiter, job, job.outputs)
    other = DisputeEvidence(
        escrow=world.escrow,
        private_key=world.providers[1],
        arbiter_url=arbiter.url,
        outputs={(deal_id, task.index): job.outputs}.get,
        start_block=start,
    )
    assert other.run() == []
    case = arbiter.case(deal_id, 0)
    assert case is not None and case["missing"]["provider"] == [0]


def test_the_client_watcher_disputes_then_hands_its_kept_program_over(
    world: World, arbiter: ArbiterProcess, job: Job, tmp_path: Path
) -> None:
    """The client never saw the delivery, disputes the claim, and its watcher uploads the
    program it kept when it sent the task; the provider's job uploads the outputs; the arbiter
    re-executes and pays the provider, who did deliver."""
    client, provider = world.clients[0], world.providers[0]
    start = int(world.escrow.tx.w3.eth.block_number)
    deal_id, _ = open_deal(world, client, provider, penalty=PENALTY)
    task = signed_delivery(world, deal_id, 0, job, job.outputs, client, provider)
    store = EnvelopeStore(tmp_path / "envelopes")
    store.keep(task.request, job.envelope, None)
    ledger = DealLedger.open(tmp_path, world.escrow.domain.chain_id, world.escrow.address, deal_id)
    ledger.put(
        TaskRecord(
            index=0,
            run=1,
            label="task 0",
            request=task.request,
            request_signature=task.request_sig,
            state=TaskState.UNDELIVERED,
            ack=task.ack,
            ack_signature=task.ack_sig,
        )
    )
    claim(world, provider, deal_id, [task])
    said: list[str] = []
    watcher = ClaimWatcher(
        ClientAccount(world.escrow, world.token, client),
        ledger,
        say=said.append,
        evidence=ProgramEvidence(
            arbiter_url=arbiter.url,
            domain=world.escrow.domain,
            key=client,
            store=store,
            say=said.append,
        ),
    )
    assert watcher.scan().disputed == (0,)

    def handed_over() -> bool:
        watcher.scan()
        case = arbiter.case(deal_id, 0)
        return case is not None and case["missing"]["client"] == []

    wait_until(handed_over, 120, "the client's program with the arbiter")
    DisputeEvidence(
        escrow=world.escrow,
        private_key=provider,
        arbiter_url=arbiter.url,
        outputs={(deal_id, 0): job.outputs}.get,
        start_block=start,
    ).run()
    assert ruled(world, arbiter, deal_id)["provider_wins"] is True
    watcher.scan()
    assert ledger.batches[0].outcome == "provider_won"
