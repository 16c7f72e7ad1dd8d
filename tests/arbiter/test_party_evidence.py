"""The parties' software hands its evidence to the arbiter by itself.

Property: once a client disputes a provider's claim, the provider's job uploads the outputs its
journal holds for every task of the batch to the deal's arbiter, and only to the deal's arbiter.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from contracts.evidence import Role
from provider.dispute_evidence import DisputeEvidence
from tests.contracts.conftest import World

from .drill import ArbiterProcess, Job, dispute, make_job, ruled, send


@pytest.fixture(scope="module")
def job() -> Job:
    return make_job()


@pytest.fixture
def arbiter(world: World, tmp_path: Path) -> Iterator[ArbiterProcess]:
    process = ArbiterProcess(world, tmp_path / "arbiter")
    process.start()
    try:
        yield process
    finally:
        process.stop()


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
