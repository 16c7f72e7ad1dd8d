"""The daemon serves while its sandbox's workers start (``provider.warm_sandbox``).

The workers are held back by a gate the test opens, so "still starting" is a state the test
controls, not a race: the health lists the sandbox as warming, a task is refused with
Retry-After (acked, it could pass its deadline waiting) and acked once they are up, a compile
target the configured platform cannot serve is refused as before, and
a platform target on a host whose platform only the workers know gets a 503 with
``Retry-After`` before any ack.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import pytest
from fastapi.testclient import TestClient

from contracts.access import (
    ACCESS_EXPIRY_HEADER,
    ACCESS_SIGNATURE_HEADER,
    result_access_digest,
)
from contracts.messages import sign_digest
from programs.envelope import ProgramEnvelope
from provider.api import create_app
from provider.config import ProviderConfig
from provider.daemon import Daemon
from provider.sandbox import Sandbox
from provider.warm_sandbox import WarmingSandbox
from provider.warmup import Warmup
from tests.polling import wait_until
from tests.provider.daemon_support import (
    ChainWorld,
    SignedTask,
    compile_task,
    provider_config,
    sign_task,
    tiny_mlp_envelope,
)


class Gate:
    """A sandbox build that waits until the test opens the gate, then gives ``sandbox``."""

    def __init__(self, sandbox: Sandbox) -> None:
        self.sandbox = sandbox
        self.open = threading.Event()

    def build(self, config: ProviderConfig) -> Sandbox:
        self.open.wait()
        return self.sandbox


@pytest.fixture
def warming(
    chain_world: ChainWorld, sandbox: Sandbox, tmp_path: Path
) -> Iterator[tuple[TestClient, Gate, Daemon]]:
    """A daemon whose sandbox starts behind a gate, served in process."""
    gate = Gate(sandbox)
    warmup = Warmup()
    config = provider_config(chain_world, tmp_path)
    starting = WarmingSandbox(config, warmup, build=gate.build)
    daemon = Daemon(config, chain=chain_world.chain, sandbox=cast(Sandbox, starting), warmup=warmup)
    try:
        daemon.start(schedule=False)
        with TestClient(create_app(daemon)) as api:
            yield api, gate, daemon
    finally:
        gate.open.set()
        daemon.close()  # the shared sandbox stays open: the module's fixture closes it


def access(world: ChainWorld, deal_id: int, index: int) -> dict[str, str]:
    """Headers proving (by a fresh signature) that the caller is the deal's client."""
    expiry = int(time.time()) + 300
    digest = result_access_digest(world.domain, deal_id, index, expiry)
    return {
        ACCESS_EXPIRY_HEADER: str(expiry),
        ACCESS_SIGNATURE_HEADER: "0x" + sign_digest(digest, world.client).hex(),
    }


def submit(api: TestClient, task: SignedTask) -> Any:
    return api.post("/v1/tasks", content=task.body, headers=task.headers())


def test_health_when_workers_start_then_503_naming_the_sandbox_warming_then_200(
    warming: tuple[TestClient, Gate, Daemon],
) -> None:
    api, gate, _ = warming

    starting = api.get("/v1/health")

    assert starting.status_code == 503
    assert int(starting.headers["Retry-After"]) >= 1
    assert starting.json()["ok"] is False
    assert starting.json()["warming"] == ["sandbox"]
    assert starting.json()["workers"] == 0
    gate.open.set()
    wait_until(lambda: api.get("/v1/health").status_code == 200, 60, "the sandbox warm")
    ready = api.get("/v1/health").json()
    assert ready["ok"] is True and ready["warming"] == [] and ready["failed"] == {}
    assert ready["workers"] >= 1


def test_health_when_workers_fail_to_start_then_503_naming_the_failure(
    chain_world: ChainWorld, tmp_path: Path
) -> None:
    def broken(config: ProviderConfig) -> Sandbox:
        raise OSError("no bubblewrap here")

    warmup = Warmup()
    config = provider_config(chain_world, tmp_path)
    starting = WarmingSandbox(config, warmup, build=broken)
    daemon = Daemon(config, chain=chain_world.chain, sandbox=cast(Sandbox, starting), warmup=warmup)
    try:
        daemon.start(schedule=False)
        with TestClient(create_app(daemon)) as api:
            wait_until(lambda: not starting.starting, 60, "the sandbox's start to end")
            health = api.get("/v1/health")
            assert health.status_code == 503
            assert health.json()["failed"] == {"sandbox": "no bubblewrap here"}
    finally:
        daemon.close()


def test_task_when_workers_start_then_503_retry_after_and_acked_once_they_are_up(
    warming: tuple[TestClient, Gate, Daemon], chain_world: ChainWorld
) -> None:
    """A task acked before the workers are up could pass its deadline waiting for them (the
    provider's penalty for its own start): it is refused with Retry-After, nothing acked, and
    the same request is acked once they are up."""
    api, gate, _ = warming
    world = chain_world
    envelope, _ = tiny_mlp_envelope()
    deal_id = world.open_deal()
    task = sign_task(world, world.client, deal_id, 0, envelope)

    refused = submit(api, task)

    assert refused.status_code == 503, refused.text
    assert refused.json()["error"] == "overloaded" and int(refused.headers["Retry-After"]) >= 1
    gate.open.set()
    wait_until(lambda: api.get("/v1/health").status_code == 200, 60, "the sandbox warm")
    acked = submit(api, task)
    assert acked.status_code == 200, acked.text
    headers = access(world, deal_id, 0)
    result = api.get(f"/v1/tasks/{deal_id}/0", params={"wait": 60}, headers=headers)
    assert result.status_code == 200, result.text
    assert result.json()["state"] == "succeeded"


def test_compile_target_when_workers_start_then_checked_by_the_configured_platform(
    warming: tuple[TestClient, Gate, Daemon], chain_world: ChainWorld
) -> None:
    api, _, daemon = warming
    world = chain_world
    envelope: ProgramEnvelope = tiny_mlp_envelope()[0]
    deal_id = world.open_deal()
    assert daemon.config.jax_platforms == "cpu"

    wrong = submit(api, compile_task(world, world.client, deal_id, 0, envelope, "gpu"))

    assert wrong.status_code == 422, wrong.text
    assert wrong.json()["error"] == "target_unsupported"
    assert "cpu" in wrong.json()["reason"]


def test_platform_target_when_workers_start_and_platform_unknown_then_503_retry_after(
    chain_world: ChainWorld, sandbox: Sandbox, tmp_path: Path
) -> None:
    gate = Gate(sandbox)
    world = chain_world
    config = provider_config(world, tmp_path, jax_platforms=None)
    starting = WarmingSandbox(config, Warmup(), build=gate.build)
    daemon = Daemon(config, chain=world.chain, sandbox=cast(Sandbox, starting))
    envelope: ProgramEnvelope = tiny_mlp_envelope()[0]
    deal_id = world.open_deal()
    try:
        daemon.start(schedule=False)
        with TestClient(create_app(daemon)) as api:
            refused = submit(api, compile_task(world, world.client, deal_id, 0, envelope, "cpu"))
            assert refused.status_code == 503, refused.text
            assert refused.json()["error"] == "overloaded"
            assert "starting" in refused.json()["reason"]
            assert int(refused.headers["Retry-After"]) >= 1
            gate.open.set()
            wait_until(lambda: not starting.starting, 60, "the sandbox warm")
            accepted = submit(api, compile_task(world, world.client, deal_id, 0, envelope, "cpu"))
            assert accepted.status_code == 200, accepted.text
    finally:
        gate.open.set()
        daemon.close()
