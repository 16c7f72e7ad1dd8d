"""No secret in what a stranger can make the daemon say: its node's API key stays out of every
answer and every log line, and a 5xx says a stable reason with ``Retry-After`` on a 503.

The daemon runs from its CLI (real uvicorn, its real JSON log on stderr) with an RPC URL that
carries a key in its path, pointing at a JSON-RPC proxy in front of anvil; once the daemon is up
the proxy answers every call with HTTP 503, and a stranger sends the requests that make the
daemon read the chain (unknown deals, result reads, deal summaries) and every other kind of
error the abuse run provokes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from contracts.access import ACCESS_EXPIRY_HEADER, ACCESS_SIGNATURE_HEADER, result_access_digest
from contracts.chain import free_port
from contracts.messages import sign_digest
from provider.access import DEAL_SCOPE
from tests import processes
from tests.polling import wait_until
from tests.provider.daemon_support import PLAN, SLO_S, ChainWorld, sign_task, tiny_mlp_envelope
from tests.rpc_proxy import RpcProxy

REPO = Path(__file__).resolve().parents[2]
SECRET = "SECRETKEY123"


class FailingNode(RpcProxy):
    """Forward to the node until `failing`, then answer every call with HTTP 503."""

    failing = False

    def intercept(self, body: bytes) -> tuple[int, bytes] | None:
        """Return a 503 once failing (the node's provider has an outage)."""
        return (503, b'{"error":"upstream unavailable"}') if self.failing else None


@pytest.fixture(scope="module")
def node(chain_world: ChainWorld) -> Iterator[FailingNode]:
    proxy = FailingNode(chain_world.anvil.url)
    yield proxy
    proxy.close()


@pytest.fixture(scope="module")
def served(
    chain_world: ChainWorld, node: FailingNode, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, Path]]:
    """The daemon (its URL and log file) reading the chain through ``node``, key in the path."""
    work = tmp_path_factory.mktemp("daemon-secrets")
    config = work / "provider.toml"
    config.write_text(
        f'rpc_url = "{node.url}/v3/{SECRET}"\n'
        f'escrow = "{chain_world.escrow.address}"\n'
        f'data_dir = "{work / "data"}"\n'
        'jax_platforms = "cpu"\n'
        f"slo_ms = {SLO_S * 1000}\n"
        "benchmark_on_start = false\n"
        "[plan]\n"
        f"compile_price = {PLAN.compile_price}\n"
        f"inference_price = {PLAN.inference_price}\n"
    )
    port = free_port()
    env = dict(os.environ, TPUMARKET_PROVIDER_PRIVATE_KEY=chain_world.provider)
    env["JAX_PLATFORMS"] = "cpu"
    log_path = work / "daemon.log"
    with log_path.open("wb") as log:
        process = processes.spawn(
            [
                *(sys.executable, "-m", "provider.cli", "run", "--no-jobs"),
                *("--config", str(config), "--port", str(port)),
            ],
            cwd=REPO,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    url = f"http://127.0.0.1:{port}"

    def up() -> bool:
        if process.poll() is not None:
            raise AssertionError(log_path.read_text()[-3000:])
        try:
            return httpx.get(url + "/v1/health", timeout=30).status_code == 200
        except httpx.HTTPError:
            return False

    try:
        wait_until(up, 120, "daemon health")
        yield url, log_path
    finally:
        processes.stop(process, grace_s=60)


def _proof(world: ChainWorld, key: str, deal_id: int, index: int) -> dict[str, str]:
    expiry = int(time.time()) + 300
    digest = result_access_digest(world.domain, deal_id, index, expiry)
    return {
        ACCESS_EXPIRY_HEADER: str(expiry),
        ACCESS_SIGNATURE_HEADER: "0x" + sign_digest(digest, key).hex(),
    }


def test_node_outage_when_a_stranger_provokes_errors_then_no_key_in_answers_or_logs(
    chain_world: ChainWorld, node: FailingNode, served: tuple[str, Path]
) -> None:
    world = chain_world
    url, log_path = served
    envelope = tiny_mlp_envelope()[0]
    node.failing = True
    replies = []
    with httpx.Client(base_url=url, timeout=60) as http:
        for deal_id in (10_001, 10_002, 10_003):  # never read: no cached state to answer from
            task = sign_task(world, world.other_client, deal_id, 0, envelope)
            replies.append(http.post("/v1/tasks", content=task.body, headers=task.headers()))
            replies.append(
                http.get(f"/v1/tasks/{deal_id}/0", headers=_proof(world, world.client, deal_id, 0))
            )
            replies.append(
                http.get(
                    f"/v1/deals/{deal_id}",
                    headers=_proof(world, world.client, deal_id, DEAL_SCOPE),
                )
            )
        replies += [
            http.get("/v1/info"),
            http.get("/v1/health"),
            http.get("/v1/tasks/1/0"),
            http.post("/v1/vouchers", content=b"[" * 10_000, headers={"content-type": "x/y"}),
            http.post("/v1/vouchers", json={"voucher": {"deal_id": 10_001}, "signature": "0x"}),
            http.get("/v1/nothing-here"),
        ]
    node.failing = False

    unavailable = [r for r in replies if r.status_code == 503]
    assert len(unavailable) >= 3  # the chain reads failed and said so
    for reply in replies:
        shown = reply.text + json.dumps(dict(reply.headers))
        assert SECRET not in shown, (reply.request.url, reply.status_code, reply.text)
        if reply.status_code >= 500:
            body = reply.json()
            assert set(body) == {"error", "reason"}
            assert "Error" not in body["reason"] and "://" not in body["reason"]
        if reply.status_code == 503:
            assert int(reply.headers["retry-after"]) >= 1
    logged = log_path.read_text()
    assert "[redacted]" in logged  # the failures were logged, their URL cut
    assert SECRET not in logged
