"""What the envelope states that a worker would refuse is refused before the ack: nothing billed.

Real anvil, real escrow, the real app and real sandbox workers (JAX on CPU). Each refusal is
a typed 422, and the task index stays free: the same index then takes a program this
provider serves (an acked index would be answered with its first ack, never run again).
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

import pytest
from fastapi.testclient import TestClient

from programs.envelope import ProgramEnvelope
from tests.provider.daemon_support import ChainWorld, compile_task, sign_task, tiny_mlp_envelope
from tests.provider.programs import envelope_for, export_fn, spec


def submit(api: TestClient, task: Any, wait: float = 0.0) -> Any:
    return api.post("/v1/tasks", content=task.body, headers=task.headers(), params={"wait": wait})


def _served_at_the_same_index(api: TestClient, world: ChainWorld, deal_id: int) -> None:
    envelope, _ = tiny_mlp_envelope()
    served = submit(api, sign_task(world, world.client, deal_id, 0, envelope), wait=60)
    assert served.status_code == 200, served.text
    assert served.json()["state"] == "succeeded", served.json()


def _tpu_only() -> ProgramEnvelope:
    envelope, _ = tiny_mlp_envelope(platforms=("tpu",))
    return envelope


def _newer_stablehlo() -> ProgramEnvelope:
    exported = export_fn(lambda x: x * 2, spec(4))
    program = re.sub(
        rb"StableHLO_v\d+\.\d+\.\d+\x00", b"StableHLO_v9.0.0\x00", exported.serialize()
    )
    return envelope_for(exported, [], program=program)


def _newer_producer(**changes: Any) -> ProgramEnvelope:
    envelope, _ = tiny_mlp_envelope()
    producer = dataclasses.replace(envelope.producer, **changes)
    return ProgramEnvelope.create(
        program=envelope.program,
        inputs=envelope.inputs,
        weights=envelope.weights,
        producer=producer,
        platforms=envelope.platforms,
        array_format=envelope.array_format,
    )


@pytest.mark.parametrize(
    ("make", "code", "said"),
    [
        (_tpu_only, "platform_unsupported", "('tpu',)"),
        (lambda: _newer_producer(jax="99.0.0"), "version_unsupported", "99.0.0"),
        (lambda: _newer_producer(calling_convention=99), "version_unsupported", "99"),
        (_newer_stablehlo, "version_unsupported", "StableHLO version 9.0.0"),
    ],
    ids=["tpu-only-on-cpu", "newer-jax", "newer-calling-convention", "newer-stablehlo"],
)
def test_inference_the_envelope_rules_out_when_submitted_then_422_before_the_ack(
    api: TestClient, chain_world: ChainWorld, make: Any, code: str, said: str
) -> None:
    world = chain_world
    deal_id = world.open_deal()
    refused = submit(api, sign_task(world, world.client, deal_id, 0, make()))
    assert refused.status_code == 422, refused.text
    body = refused.json()
    assert body["error"] == code, body
    assert said in body["reason"], body
    _served_at_the_same_index(api, world, deal_id)


def test_compile_for_a_tpu_target_of_a_cpu_only_program_then_422_before_the_ack(
    api: TestClient, chain_world: ChainWorld
) -> None:
    world = chain_world
    deal_id = world.open_deal()
    envelope, _ = tiny_mlp_envelope(platforms=("cpu",))
    refused = submit(api, compile_task(world, world.client, deal_id, 0, envelope, "v5e:1x1"))
    assert refused.status_code == 422, refused.text
    body = refused.json()
    assert body["error"] == "platform_unsupported", body
    assert "tpu" in body["reason"], body
    _served_at_the_same_index(api, world, deal_id)
