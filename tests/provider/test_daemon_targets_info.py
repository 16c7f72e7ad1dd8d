"""The daemon refuses compile targets it cannot serve before the ack, and says what walls it.

Real anvil, real escrow, the real app and real sandbox workers (JAX on CPU).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from provider.config import load_config
from provider.errors import ConfigError
from tests.provider.daemon_support import ChainWorld, compile_task, tiny_mlp_envelope


def submit(api: TestClient, task: Any, wait: float = 0.0) -> Any:
    return api.post("/v1/tasks", content=task.body, headers=task.headers(), params={"wait": wait})


@pytest.mark.parametrize("target", ["tpu", "gpu", "v4:64x64x64"])
def test_compile_target_this_host_cannot_serve_then_422_before_the_ack(
    api: TestClient, chain_world: ChainWorld, target: str
) -> None:
    world = chain_world
    envelope, _ = tiny_mlp_envelope()
    deal_id = world.open_deal()
    refused = submit(api, compile_task(world, world.client, deal_id, 0, envelope, target))
    assert refused.status_code == 422, refused.text
    body = refused.json()
    assert body["error"] == "target_unsupported"
    assert target in body["reason"]
    # Nothing was acked: the same index is free for a target this host serves.
    served = submit(api, compile_task(world, world.client, deal_id, 0, envelope, "cpu"), wait=60)
    assert served.status_code == 200, served.text
    assert served.json()["state"] == "succeeded", served.json()


def test_info_when_asked_then_device_class_isolation_and_output_budget(api: TestClient) -> None:
    info = api.get("/v1/info").json()
    assert info["device_class"] == "cpu"
    isolation = info["isolation"]
    assert isolation["mode"] in ("bwrap", "unshare", "rlimits")
    assert isolation["bubblewrap"] is (isolation["mode"] == "bwrap")
    assert isinstance(isolation["seccomp"], bool) and isolation["workers"] >= 1
    assert info["output_memory_bytes"] == 256 * 1024 * 1024


def test_output_memory_bytes_when_set_in_toml_or_env_then_read_and_negative_refused(
    tmp_path: Path,
) -> None:
    config = tmp_path / "provider.toml"
    config.write_text(
        f'private_key = "0x{"11" * 32}"\nrpc_url = "http://127.0.0.1:1"\n'
        f'escrow = "0x{"22" * 20}"\ndata_dir = "{tmp_path}"\noutput_memory_bytes = 1000\n'
        "[plan]\ncompile_price = 1\ninference_price = 1\n"
    )
    assert load_config(config, {}).output_memory_bytes == 1000
    env = {"TPUMARKET_PROVIDER_OUTPUT_MEMORY_BYTES": "0"}
    assert load_config(config, env).output_memory_bytes == 0
    with pytest.raises(ConfigError, match="output_memory_bytes must be >= 0"):
        load_config(config, {"TPUMARKET_PROVIDER_OUTPUT_MEMORY_BYTES": "-5"})
