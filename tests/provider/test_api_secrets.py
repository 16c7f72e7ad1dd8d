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
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from provider.access import DEAL_SCOPE
from tests.provider.access_support import proof
from tests.provider.daemon_support import (
    ChainWorld,
    served_daemon,
    sign_task,
    tiny_mlp_envelope,
)
from tests.rpc_proxy import FailingNode

SECRET = "SECRETKEY123"


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
    with served_daemon(chain_world, work, rpc_url=f"{node.url}/v3/{SECRET}") as daemon:
        yield daemon.url, daemon.log_path


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
                http.get(f"/v1/tasks/{deal_id}/0", headers=proof(world, world.client, deal_id, 0))
            )
            replies.append(
                http.get(
                    f"/v1/deals/{deal_id}",
                    headers=proof(world, world.client, deal_id, DEAL_SCOPE),
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
