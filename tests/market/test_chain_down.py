"""The market starts with its chain node down, serves reads and says what is missing.

A real server process started with an RPC URL (carrying a key) where nothing listens and a
`--chain-id`: it serves, `/v1/health` says the chain is missing, every read answers, and what
needs the escrow (an ask's stake, a heartbeat's stake) is a 503 with `Retry-After` whose body
names neither the node nor the error underneath.
"""

from __future__ import annotations

import time
from pathlib import Path

import httpx

from contracts.chain import free_port

from .server import market_process
from .signing import CHAIN_ID, Trader

SECRET = "K3Y-0F-TH3-N0D3"


def test_start_when_chain_is_down_then_reads_served_health_degraded_and_503s_say_no_secret(
    tmp_path: Path,
) -> None:
    rpc = f"http://127.0.0.1:{free_port()}/v3/{SECRET}"
    escrow = "0x" + "ab" * 20
    provider = Trader(escrow=escrow)
    now = int(time.time())
    with (
        market_process(
            tmp_path / "data", "--rpc-url", rpc, "--escrow", escrow, "--chain-id", str(CHAIN_ID)
        ) as (url, _),
        httpx.Client(base_url=url, timeout=30) as client,
    ):
        health = client.get("/v1/health")
        reads = [
            client.get(path)
            for path in (
                "/healthz",
                "/v1/book/tpu-v5e",
                "/v1/overview",
                "/v1/offers",
                "/v1/fills",
                "/v1/classes",
                "/v1/domain",
                "/v1/providers",
            )
        ]
        refused = [
            client.post("/v1/orders", json=provider.ask(now, price=100)),
            client.post("/v1/providers/heartbeat", json=provider.heartbeat(now)),
        ]
    assert health.status_code == 200
    assert health.json()["status"] == "degraded"
    assert health.json()["chain"] == "unreachable"
    assert health.json()["missing"] and "chain" in health.json()["missing"][0]
    assert [r.status_code for r in reads] == [200] * len(reads)
    assert reads[6].json()["escrow_block"] is None
    assert [r.status_code for r in refused] == [503, 503]
    for response in (health, *reads, *refused):
        body = response.text
        for leak in (SECRET, "127.0.0.1:", "Errno", "refused", "Traceback", "HTTPConnection"):
            assert leak not in body, (response.request.url, body)
    for response in refused:
        assert int(response.headers["retry-after"]) >= 1
        assert response.json()["error"] == "ChainUnavailableError"
