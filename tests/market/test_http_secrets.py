"""No secret in what a stranger can make the market say: the API key in its RPC URL stays out of
every answer and every log line, and a 503 says a stable reason with ``Retry-After``.

The market runs from its CLI (real uvicorn, its log captured) with an RPC URL that carries a key
in its path and query, pointing at a JSON-RPC proxy in front of anvil; once the market is up the
proxy answers every call with HTTP 503, and a stranger sends the requests that make the market
read the chain (signed orders and heartbeats whose funds it checks) and the malformed requests
the abuse run sends. The log is scanned from then on (the operator's own start-up lines name
the URL it was given).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from contracts.chain import Anvil
from tests.polling import wait_until
from tests.rpc_proxy import FailingNode

from .chain import ChainWorld, deploy_world
from .server import market_process
from .signing import Trader

SECRETS = ("SECRETKEY123", "QUERYKEY456")
JSON = {"content-type": "application/json"}


@pytest.fixture(scope="module")
def world() -> Iterator[ChainWorld]:
    with Anvil.start(accounts=10) as anvil:
        yield deploy_world(anvil)


@pytest.fixture(scope="module")
def node(world: ChainWorld) -> Iterator[FailingNode]:
    proxy = FailingNode(world.anvil.url)
    yield proxy
    proxy.close()


@pytest.fixture(scope="module")
def served(
    world: ChainWorld, node: FailingNode, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, Path]]:
    data = tmp_path_factory.mktemp("secrets") / "data"
    rpc = f"{node.url}/v3/{SECRETS[0]}?apikey={SECRETS[1]}"
    with market_process(data, "--rpc-url", rpc, "--escrow", world.escrow.address) as (url, _):
        port = url.rsplit(":", 1)[1]
        yield url, data.parent / f"server-{port}.log"


def test_node_outage_when_a_stranger_provokes_errors_then_no_key_in_answers_or_logs(
    world: ChainWorld, node: FailingNode, served: tuple[str, Path]
) -> None:
    url, log_path = served
    started = log_path.stat().st_size  # the start-up lines print the operator's own URL
    node.failing = True
    trader = Trader(chain_id=world.anvil.chain_id, escrow=world.escrow.address)
    now = int(time.time())
    replies = []
    with httpx.Client(base_url=url, timeout=60) as http:
        for _ in range(3):
            replies.append(http.post("/v1/orders", json=trader.bid(now)))
            replies.append(http.post("/v1/orders", json=trader.ask(now)))
            replies.append(http.post("/v1/providers/heartbeat", json=trader.heartbeat(now)))
        replies += [
            http.post("/v1/orders", content=b"[" * 10_000, headers=JSON),
            http.post("/v1/orders", content=b"{}", headers={"content-type": "text/plain"}),
            http.post("/v1/orders/batch", json={"orders": [{}] * 3}),
            http.get("/v1/deals/nope"),
            http.get("/v1/orders/" + "9" * 300),
            http.get("/v1/book", params={"device_class": "x" * 500}),
            http.get("/nothing-here"),
        ]
        wait_until(lambda: "[redacted]" in _since(log_path, started), 60, "a redacted log line")
    node.failing = False

    unavailable = [r for r in replies if r.status_code == 503]
    assert len(unavailable) >= 3  # the funds checks could not read the chain
    for reply in replies:
        shown = reply.text + json.dumps(dict(reply.headers))
        assert not [s for s in SECRETS if s in shown], (reply.request.url, reply.text)
        if reply.status_code >= 500:
            detail = reply.json()["detail"]
            assert "://" not in detail and "Error" not in detail
        if reply.status_code == 503:
            assert int(reply.headers["retry-after"]) >= 1
    logged = _since(log_path, started)
    assert "[redacted]" in logged  # the failures were logged, their URL cut
    assert not [s for s in SECRETS if s in logged]


def _since(path: Path, offset: int) -> str:
    with path.open("rb") as log:
        log.seek(offset)
        return log.read().decode(errors="replace")
