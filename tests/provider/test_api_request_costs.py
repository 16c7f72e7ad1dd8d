"""What a stranger's invalid requests cost the daemon: no chain read on the event loop, a
bounded number of reads at once, none for an id already found missing, and no lookup or
signature check for a voucher of unknown keys.

The daemon runs from its CLI (real uvicorn, real sockets) and reads the chain through a
JSON-RPC proxy in front of anvil that can hold every ``getDeal`` call until the test lets it go,
and counts them.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from eth_utils import keccak

from contracts.messages import KIND_INFERENCE, TaskRequest
from provider.deals import MAX_READS, MAX_WAITING
from tests.polling import wait_until
from tests.provider.daemon_support import ChainWorld, ServedDaemon, served_daemon
from tests.rpc_proxy import RpcProxy

GET_DEAL = "0x" + keccak(text="getDeal(uint256)")[:4].hex()
FLOOD = MAX_WAITING + 16
UNKNOWN = 10**9  # deal ids from here on were never opened
JSON = {"Content-Type": "application/json"}


class HoldingNode(RpcProxy):
    """Forward to the node, counting ``getDeal`` calls; hold them while ``gate`` is shut."""

    def __init__(self, upstream: str) -> None:
        """Start forwarding with the gate open."""
        super().__init__(upstream)
        self.gate = threading.Event()
        self.gate.set()
        self.lock = threading.Lock()
        self.get_deals = 0
        self.held = 0
        self.most_held = 0

    def intercept(self, body: bytes) -> tuple[int, bytes] | None:
        """Count a ``getDeal`` call and hold it until the gate opens; forward everything."""
        if GET_DEAL.encode() not in body.lower():
            return None
        with self.lock:
            self.get_deals += 1
            self.held += 1
            self.most_held = max(self.most_held, self.held)
        try:
            self.gate.wait(120)  # a ceiling for a hang only: the test opens it
        finally:
            with self.lock:
                self.held -= 1
        return None


@pytest.fixture(scope="module")
def node(chain_world: ChainWorld) -> Iterator[HoldingNode]:
    proxy = HoldingNode(chain_world.anvil.url)
    yield proxy
    proxy.gate.set()
    proxy.close()


@pytest.fixture(scope="module")
def served(
    chain_world: ChainWorld, node: HoldingNode, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServedDaemon]:
    # A long cache TTL (and so a long negative TTL): the test's rounds never outlive it.
    settings = "deal_cache_ttl_s = 600\n[http]\nmax_connections_per_ip = 1000\nrate_per_ip = 0\n"
    work = tmp_path_factory.mktemp("daemon-costs")
    with served_daemon(chain_world, work, rpc_url=node.url, settings=settings) as daemon:
        yield daemon


def _task_headers(world: ChainWorld, deal_id: int) -> dict[str, str]:
    """A well-formed task request for ``deal_id``, signed by the client."""
    request = TaskRequest(
        deal_id=deal_id,
        task_index=0,
        kind=KIND_INFERENCE,
        program_hash=b"\1" * 32,
        input_hash=b"\2" * 32,
        max_price=1_000,
        deadline=2**40,
    )
    return {
        "X-Tpumarket-Request": json.dumps(request.to_json()),
        "X-Tpumarket-Signature": "0x" + request.sign(world.domain, world.client).hex(),
        "Content-Type": "application/octet-stream",
    }


def test_unknown_deal_flood_when_the_node_is_slow_then_reads_bounded_loop_free_and_cached(
    chain_world: ChainWorld, node: HoldingNode, served: ServedDaemon
) -> None:
    ids = [UNKNOWN + i for i in range(FLOOD)]
    headers = {deal_id: _task_headers(chain_world, deal_id) for deal_id in ids}
    answered: dict[int, int] = {}

    def submit(deal_id: int) -> None:
        with httpx.Client(base_url=served.url, timeout=150) as http:
            reply = http.post("/v1/tasks", content=b"", headers=headers[deal_id])
            answered[deal_id] = reply.status_code

    node.gate.clear()
    before = node.get_deals
    try:
        with ThreadPoolExecutor(FLOOD) as pool:
            futures = [pool.submit(submit, deal_id) for deal_id in ids]
            # Past the lookups that may wait, the rest are refused at once.
            wait_until(lambda: len(answered) >= FLOOD - MAX_WAITING, 120, "busy answers")
            wait_until(lambda: node.held == MAX_READS, 120, "reads held at the node")
            with httpx.Client(base_url=served.url, timeout=60) as http:
                health = http.get("/v1/health").status_code  # the loop serves meanwhile
                info = http.get("/v1/info").status_code
            busy = sorted(answered.values())
            node.gate.set()
            for future in futures:
                future.result()
    finally:
        node.gate.set()

    assert health == 200 and info == 200
    assert busy == [503] * (FLOOD - MAX_WAITING)
    assert node.most_held == MAX_READS
    assert sorted(answered.values()) == [404] * MAX_WAITING + [503] * (FLOOD - MAX_WAITING)
    first_round = node.get_deals - before
    assert first_round == MAX_WAITING  # one read per waiting id, none for the refused

    # Again: the ids found missing are refused from the cache, without a read.
    with httpx.Client(base_url=served.url, timeout=60) as http:
        again = [
            http.post("/v1/tasks", content=b"", headers=headers[deal_id]).status_code
            for deal_id, status in answered.items()
            if status == 404
        ]
        zero = http.post("/v1/tasks", content=b"", headers=_task_headers(chain_world, 0))
    assert again == [404] * MAX_WAITING
    assert zero.status_code == 404 and zero.json()["error"] == "deal_not_found"
    assert node.get_deals - before == first_round


def test_voucher_when_thousands_of_unknown_keys_then_refused_before_any_lookup(
    chain_world: ChainWorld, node: HoldingNode, served: ServedDaemon
) -> None:
    deal_id = UNKNOWN + 10 * FLOOD  # never read: a read would be counted
    junk = {f"k{i}": i for i in range(4_000)}
    signature = "0x" + "11" * 65
    voucher = {"deal_id": deal_id, "cumulative_amount": 1, "tasks": ["1"], **junk}
    bodies = [
        {"voucher": voucher, "signature": signature},
        {"voucher": {"deal_id": deal_id, "cumulative_amount": 1, "tasks": ["1"]}, **junk},
        {"voucher": {"deal_id": deal_id, "cumulative_amount": 1, "tasks": ["1"] * 10_000}},
    ]
    before = node.get_deals
    with httpx.Client(base_url=served.url, timeout=60) as http:
        replies = [http.post("/v1/vouchers", content=json.dumps(b), headers=JSON) for b in bodies]
    sizes = [len(json.dumps(b)) for b in bodies]

    assert all(30_000 < size <= 64 * 1024 for size in sizes), sizes
    assert [r.status_code for r in replies] == [422, 422, 422], [r.text[:300] for r in replies]
    reasons = [r.json()["reason"] for r in replies]
    assert "unknown key 'k0' (4003 keys)" in reasons[0]
    assert "unknown key 'k0' (4001 keys)" in reasons[1]
    assert "10000 task bitmap words, at most 256" in reasons[2]
    assert node.get_deals == before
