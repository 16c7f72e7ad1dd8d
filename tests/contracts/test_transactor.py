"""The transactor against a real anvil: batched reads, typed chain errors, EIP-1559 fees."""

from __future__ import annotations

import http.server
import json
import socket
import threading
import urllib.request
from collections.abc import Iterator

import pytest

from contracts.binding import TASK_NONE, Chain, connect
from contracts.chain import rpc
from contracts.errors import ChainError, ChainTimeoutError, FeeTooLowError, NonceTooLowError
from contracts.reverts import EscrowDealNotFound, EscrowTaskIndexTooLarge
from contracts.transactor import classify
from tests.contracts.conftest import World


@pytest.fixture
def silent_port() -> Iterator[int]:
    """A port that accepts connections and never answers."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        yield listener.getsockname()[1]


def test_batched_reads_equal_single_reads(world: World) -> None:
    client, provider = world.addr(world.clients[0]), world.addr(world.providers[0])
    world.escrow.deposit(world.clients[0], 1234)
    calls = [
        ("balanceOf", (client,)),
        ("stakeOf", (provider,)),
        ("taskStatus", (1, 7)),
        ("minChallengeWindow", ()),
        ("dealCount", ()),
    ]
    batched = world.escrow.read_many(calls)
    assert batched == [
        world.escrow.balance_of(client),
        world.escrow.stake_of(provider),
        TASK_NONE,
        world.escrow.min_challenge_window(),
        world.escrow.deal_count(),
    ]
    assert batched[0] == 1234


def test_a_batched_read_that_reverts_raises_its_typed_error(world: World) -> None:
    with pytest.raises(EscrowTaskIndexTooLarge) as caught:
        world.escrow.read_many([("taskStatus", (1, 0)), ("taskStatus", (1, 2**32 - 1))])
    assert caught.value.error_args == {"taskIndex": 2**32 - 1}
    with pytest.raises(EscrowDealNotFound):
        world.escrow.read_many([("getDeal", (999,))])


def test_transactions_pay_the_chains_priority_fee(world: World) -> None:
    w3 = world.chain.w3
    tip = int(w3.eth.max_priority_fee)
    assert tip > 0
    result = world.escrow.deposit(world.clients[0], 5)
    tx = w3.eth.get_transaction(result.tx_hash)  # type: ignore[arg-type]
    assert tx["maxPriorityFeePerGas"] == tip
    assert tx["maxFeePerGas"] >= tip


def test_a_stale_fee_cap_is_refreshed_once_and_the_send_goes_through(world: World) -> None:
    tx = world.chain.tx
    tx.fees(refresh=True)
    cached_cap = tx.fees()[0]
    rpc(world.anvil.url, "anvil_setNextBlockBaseFeePerGas", [hex(cached_cap * 4)])
    result = world.escrow.deposit(world.clients[0], 5)
    assert result.gas_used > 0
    assert tx.fees()[0] > cached_cap


def test_a_nonce_used_behind_the_transactors_back_is_recovered_once(world: World) -> None:
    key = world.clients[1]
    world.escrow.deposit(key, 1)  # the transactor now tracks this sender's nonce
    other = Chain(world.anvil.url, world.chain.artifacts)
    other.escrow(world.escrow.address).deposit(key, 1)  # uses the nonce the first expects
    result = world.escrow.deposit(key, 1)
    assert result.gas_used > 0
    assert world.escrow.balance_of(world.addr(key)) == 3


def test_a_silent_endpoint_is_a_chain_timeout(silent_port: int) -> None:
    with pytest.raises(ChainTimeoutError, match="no JSON-RPC endpoint answers"):
        connect(f"http://127.0.0.1:{silent_port}", timeout_s=0.5)


def test_a_closed_port_is_a_chain_error_not_a_timeout() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with pytest.raises(ChainError) as caught:
        connect(f"http://127.0.0.1:{port}", timeout_s=2)
    assert not isinstance(caught.value, ChainTimeoutError)


def test_node_rejections_are_classified_by_kind(world: World) -> None:
    """Each rejection the node really sends maps to its type (read from live answers)."""
    from eth_account import Account

    w3 = world.chain.w3
    key = world.clients[2]
    sender = world.addr(key)
    base = {"to": sender, "value": 0, "gas": 21000, "chainId": w3.eth.chain_id, "data": b""}
    nonce = w3.eth.get_transaction_count(sender, "pending")  # type: ignore[arg-type]
    too_cheap = dict(base, nonce=nonce, maxFeePerGas=1, maxPriorityFeePerGas=0)
    with pytest.raises(Exception) as caught:
        w3.eth.send_raw_transaction(Account.sign_transaction(too_cheap, key).raw_transaction)
    assert isinstance(classify(caught.value), FeeTooLowError)
    max_fee, tip = world.chain.tx.fees(refresh=True)
    world.escrow.deposit(key, 1)
    stale = dict(base, nonce=nonce, maxFeePerGas=max_fee, maxPriorityFeePerGas=tip)
    with pytest.raises(Exception) as caught:
        w3.eth.send_raw_transaction(Account.sign_transaction(stale, key).raw_transaction)
    assert isinstance(classify(caught.value), NonceTooLowError)


class _StaleBlockProxy:
    """A JSON-RPC proxy in front of the real node that answers the first `stale` eth_calls with
    the development node's stale-block race, and forwards everything else."""

    def __init__(self, upstream: str, stale: int) -> None:
        self.upstream, self.stale, self.calls = upstream, stale, 0
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                request = json.loads(body)
                if isinstance(request, dict) and request.get("method") == "eth_call":
                    proxy.calls += 1
                    if proxy.calls <= proxy.stale:
                        error = {"code": -32000, "message": "BlockOutOfRangeError: block height "
                                 "is 16 but requested was 15"}  # fmt: skip
                        answer = json.dumps({"jsonrpc": "2.0", "id": request["id"], "error": error})
                        return self._send(answer.encode())
                forwarded = urllib.request.Request(
                    proxy.upstream, body, {"Content-Type": "application/json"}
                )
                with urllib.request.urlopen(forwarded, timeout=10) as reply:
                    self._send(reply.read())

            def _send(self, data: bytes) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_a_read_the_node_refuses_for_a_block_it_just_moved_past_is_asked_again(
    world: World,
) -> None:
    client = world.addr(world.clients[0])
    expected = world.escrow.balance_of(client)
    proxy = _StaleBlockProxy(world.anvil.url, stale=2)
    try:
        escrow = Chain(proxy.url).escrow(world.escrow.address)
        assert escrow.balance_of(client) == expected
        assert proxy.calls == 3  # two stale answers, then the real one
        proxy.calls, proxy.stale = 0, 100  # a node that never gets past it: a typed error
        with pytest.raises(ChainError, match="block height is"):
            escrow.balance_of(client)
        assert proxy.calls == 4  # asked again three times, not forever
    finally:
        proxy.close()
