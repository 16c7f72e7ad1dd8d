"""Replicated tasks: the SDK compares two providers' outputs within the arbiter's tolerance and,
when they disagree, disputes both claims with the program; the arbiter's re-execution decides
which replica is paid (a real arbiter process on anvil, a real program re-executed)."""

from __future__ import annotations

from functools import partial

import numpy as np
import pytest

from client.accounts import ClientAccount
from client.replicas import (
    Replica,
    ReplicaError,
    ReplicaReferee,
    arbiter_tolerance,
    compare_replicas,
)
from contracts.evidence import Role
from programs.envelope import ArrayFormat, decode_arrays, encode_arrays
from tests.contracts.builders import claim, open_deal
from tests.contracts.conftest import World
from tests.polling import wait_until

from .drill import PENALTY, ArbiterProcess, Job, altered, conserved, send, signed_delivery


def ruled(arbiter: ArbiterProcess, deal_id: int) -> bool:
    return arbiter.ruling(deal_id, 0) is not None


def nudged(outputs: bytes, by: float) -> bytes:
    arrays = decode_arrays(outputs, ArrayFormat.SAFETENSORS)
    return encode_arrays({k: np.asarray(v, np.float32) * (1 + by) for k, v in arrays.items()})


def test_replicas_within_the_arbiters_tolerance_agree_and_beyond_it_disagree(
    arbiter: ArbiterProcess, job: Job
) -> None:
    tolerance = arbiter_tolerance(arbiter.url)
    same = [Replica(1, 0, job.outputs), Replica(2, 0, nudged(job.outputs, 1e-6))]
    assert compare_replicas(same, tolerance).agree
    wrong = compare_replicas(
        [Replica(1, 0, job.outputs), Replica(2, 0, altered(job.outputs))], tolerance
    )
    assert (
        not wrong.agree and wrong.differences[0] is None and "differs" in str(wrong.differences[1])
    )
    with pytest.raises(ReplicaError):
        compare_replicas(same[:1], tolerance)


def test_disagreeing_replicas_the_arbiter_pays_the_right_one_and_refunds_the_other(
    world: World, arbiter: ArbiterProcess, job: Job
) -> None:
    client = world.clients[0]
    start = int(world.escrow.tx.w3.eth.block_number)
    replicas = []
    for index, outputs in ((0, job.outputs), (1, altered(job.outputs))):
        provider = world.providers[index]
        deal_id, _ = open_deal(world, client, provider, penalty=PENALTY)
        task = signed_delivery(world, deal_id, 0, job, outputs, client, provider)
        # Neither replica is vouched: each provider claims its receipt.
        claim(world, provider, deal_id, [task])
        replicas.append(Replica(deal_id, 0, outputs))
    assert not compare_replicas(replicas, arbiter_tolerance(arbiter.url)).agree

    account = ClientAccount(world.escrow, world.token, client)
    referee = ReplicaReferee(account=account, arbiter_url=arbiter.url, from_block=start)
    batches = [referee.dispute(r) for r in replicas]
    assert batches == [0, 0]
    for r in replicas:
        wait_until(partial(referee.hand_over, r, 0, job.envelope), 60, "the program taken")
    # Each provider hands over the outputs it receipted.
    for index, r in enumerate(replicas):
        send(world, arbiter, r.deal_id, Role.PROVIDER_OUTPUTS, r.outputs, world.providers[index])
    for r in replicas:
        wait_until(partial(ruled, arbiter, r.deal_id), 300, "the ruling")
    assert [referee.outcome(r, 0) for r in replicas] == [True, False]
    assert conserved(world)
