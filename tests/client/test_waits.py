"""A command whose chain stops answering says what it waits for, how long, and its timeout.

The node is a real anvil behind a JSON-RPC proxy (``tests/rpc_proxy.py``) that holds every
request until the test lets it go: the command, a real ``tpumarket client balance`` process,
must name the stalled call on stderr while it waits, then finish normally once the node
answers again.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

from client.waits import NOTE_AFTER_S, describe
from tests import processes
from tests.contracts.conftest import World
from tests.polling import wait_until
from tests.rpc_proxy import RpcProxy

ROOT = Path(__file__).resolve().parents[2]


class StalledNode(RpcProxy):
    """Hold every request until ``release`` is set, then forward it."""

    def __init__(self, upstream: str) -> None:
        super().__init__(upstream)
        self.release = threading.Event()

    def intercept(self, body: bytes) -> tuple[int, bytes] | None:
        self.release.wait(300)
        return None


def test_chain_stalled_then_the_command_names_the_call_its_wait_and_timeout(
    world: World, tmp_path: Path
) -> None:
    node = StalledNode(world.anvil.url)
    key = world.anvil.new_funded_key()
    stderr = tmp_path / "stderr.txt"
    argv = ["client", "balances", "--rpc-url", node.url, "--escrow", world.escrow.address]
    env = {**os.environ, "TPUMARKET_CLIENT_KEY": key, "TPUMARKET_CLIENT_STATE": str(tmp_path)}
    try:
        with stderr.open("w") as err:
            process = processes.spawn(
                [sys.executable, "-m", "client.cli", *argv, "--json"],
                cwd=ROOT,
                env=env,
                stdout=subprocess.PIPE,
                stderr=err,
            )
        try:
            wait_until(
                lambda: "waiting" in stderr.read_text() or process.poll() is not None,
                3 * NOTE_AFTER_S,
                "a line naming the stalled call",
            )
            node.release.set()
            out, _ = process.communicate(timeout=120)
        finally:
            processes.stop(process)
    finally:
        node.release.set()
        node.close()
    said = stderr.read_text()
    assert process.returncode == 0, said
    line = next(line for line in said.splitlines() if line.startswith("waiting"))
    assert f"for the chain at {node.url} (eth_chainId)" in line
    assert "each try gives up after 30 s" in line
    assert out.strip().splitlines()[-1].startswith(b"{"), out  # its answer, once released


def test_describe_names_the_market_a_provider_and_a_batch_of_calls() -> None:
    batch = b'[{"method": "eth_call"}, {"method": "eth_getBalance"}]'
    assert describe("POST", "http://node:8545", batch) == (
        "the chain at http://node:8545 (eth_call, eth_getBalance)"
    )
    assert describe("GET", "http://m:1/v1/orders?owner=0x1", b"") == (
        "the market at http://m:1 (GET /v1/orders)"
    )
    assert describe("POST", "http://p:2/v1/tasks", b"\x00") == (
        "the service at http://p:2 (POST /v1/tasks)"
    )
