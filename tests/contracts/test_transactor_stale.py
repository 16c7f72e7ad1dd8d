"""Every request the transactor makes, against a real anvil answering for a block it lacks.

anvil runs with `--prune-history`: it keeps the state of its head only, so a read pinned to the
block before the head, or past it, gets its real answer ``BlockOutOfRangeError: block height
is N but requested was M``. The reads the transactor pins itself ("latest", "pending") and the
requests with no block at all cannot be pinned from outside; for those a proxy in front of the
node plays a node that lags: it answers the chosen methods with what the real node answers,
at that moment, to a state read at the block it has just pruned.
"""

from __future__ import annotations

import json
import re
import time
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from eth_account import Account

from contracts.binding import Chain, Escrow, connect
from contracts.chain import Anvil, rpc
from contracts.errors import ChainTimeoutError, StaleBlockError
from contracts.transactor import (
    STALE_BLOCK_BACKOFF_S,
    STALE_BLOCK_RETRIES,
    ErrorDecoder,
    Transactor,
)
from tests.contracts.conftest import World
from tests.rpc_proxy import RpcProxy

ANSWERED = STALE_BLOCK_RETRIES + 1
"""How many times a request that keeps getting a stale answer is made in all."""
STALE = r"BlockOutOfRangeError: block height is (\d+) but requested was (\d+)"


class LaggingNode(RpcProxy):
    """A JSON-RPC proxy in front of the real node. The first `stale` requests of each method in
    `methods` get the real node's answer to a balance read at the block before its head (which
    it has pruned), after the request itself was forwarded when `reached`; every other request
    is forwarded. `asked` counts requests per method."""

    def __init__(
        self, upstream: str, methods: set[str], stale: int, *, reached: bool = False
    ) -> None:
        super().__init__(upstream)
        self.methods, self.stale, self.reached = methods, stale, reached
        self.asked: Counter[str] = Counter()
        self.answered_stale: Counter[str] = Counter()

    def intercept(self, body: bytes) -> tuple[int, bytes] | None:
        request = json.loads(body)
        method = request.get("method") if isinstance(request, dict) else None
        if method is not None:
            self.asked[method] += 1
        if method not in self.methods or self.answered_stale[method] >= self.stale:
            return None
        self.answered_stale[method] += 1
        if self.reached:  # the request reached the node; only its answer is lost
            self.forward(body)
        return 200, self.stale_answer(request["id"])

    def stale_answer(self, request_id: Any) -> bytes:
        head = int(rpc(self.upstream, "eth_blockNumber"), 16)
        read = {"jsonrpc": "2.0", "id": request_id, "method": "eth_getBalance"}
        read["params"] = ["0x" + "00" * 20, hex(head - 1)]
        answer = self.forward(json.dumps(read).encode())
        assert "error" in json.loads(answer), answer  # the real node's own refusal
        return answer


@pytest.fixture
def lagging(world: World) -> Iterator[Callable[[set[str], int], tuple[LaggingNode, Escrow]]]:
    """Start a lagging proxy in front of the session's anvil; return it and the escrow bound
    through it by a transactor of its own (no fees or nonces cached)."""
    proxies: list[LaggingNode] = []

    def start(methods: set[str], stale: int, reached: bool = False) -> tuple[LaggingNode, Escrow]:
        proxy = LaggingNode(world.anvil.url, methods, stale, reached=reached)
        proxies.append(proxy)
        return proxy, Chain(proxy.url, world.chain.artifacts).escrow(world.escrow.address)

    try:
        yield start
    finally:
        for proxy in proxies:
            proxy.close()


def _read(world: World, escrow: Escrow) -> None:
    assert escrow.balance_of(world.addr(world.clients[0])) == world.escrow.balance_of(
        world.addr(world.clients[0])
    )


def _deposit(world: World, escrow: Escrow) -> None:
    assert escrow.deposit(world.clients[0], 7).gas_used > 0


PATHS = [
    ("eth_call", "calling", _read),
    ("eth_getBlockByNumber", "reading the base fee", _deposit),
    ("eth_getTransactionCount", "reading the nonce", _deposit),
    ("eth_estimateGas", "estimating gas", _deposit),
    ("eth_sendRawTransaction", "sending the transaction", _deposit),
    ("eth_getTransactionReceipt", "waiting for the receipt of 0x[0-9a-f]{64}", _deposit),
]
IDS = [method for method, _, _ in PATHS]


@pytest.mark.parametrize(("method", "what", "action"), PATHS, ids=IDS)
def test_a_stale_answer_is_asked_again_and_the_request_goes_through(
    world: World, lagging: Any, method: str, what: str, action: Any
) -> None:
    before = world.escrow.balance_of(world.addr(world.clients[0]))
    proxy, escrow = lagging({method}, 2)
    action(world, escrow)
    assert proxy.answered_stale[method] == 2
    if method == "eth_getTransactionReceipt":  # polled until mined: perhaps more than once
        assert proxy.asked[method] >= 3
    else:
        assert proxy.asked[method] == 3  # the two stale answers, then the real one
    if action is _deposit:  # sent once: the balance grew by one deposit
        assert world.escrow.balance_of(world.addr(world.clients[0])) == before + 7


@pytest.mark.parametrize(("method", "what", "action"), PATHS, ids=IDS)
def test_a_node_that_stays_stale_gets_a_bounded_retry_then_a_typed_error(
    world: World, lagging: Any, method: str, what: str, action: Any
) -> None:
    client = world.addr(world.clients[0])
    before = world.escrow.balance_of(client)
    proxy, escrow = lagging({method}, 1000)
    expected = rf"^{what}: the node answered {ANSWERED} times for a block it does not have: "
    started = time.monotonic()
    with pytest.raises(StaleBlockError, match=expected + STALE) as caught:
        action(world, escrow)
    assert proxy.asked[method] == ANSWERED  # asked again STALE_BLOCK_RETRIES times, not forever
    assert time.monotonic() - started >= STALE_BLOCK_BACKOFF_S * sum(range(ANSWERED))  # backoff
    height, requested = map(int, re.findall(STALE, str(caught.value))[0])
    assert requested == height - 1
    mined = method == "eth_getTransactionReceipt"  # sent and mined; only its receipt was lost
    assert world.escrow.balance_of(client) == before + (7 if mined else 0)
    proxy.stale = 0  # the node catches up: the same transactor sends again (nonce not lost)
    _deposit(world, escrow)
    assert world.escrow.balance_of(client) == before + (14 if mined else 7)


@pytest.mark.parametrize("lost", [1, 2], ids=["one-lost-answer", "two-lost-answers"])
def test_a_send_whose_answer_is_lost_is_never_sent_again_with_a_fresh_nonce(
    world: World, lagging: Any, lost: int
) -> None:
    """The node mines the deposit but its answer to the send is lost: the same bytes asked
    again get "nonce too low". The transactor finds its own transaction on the node and takes
    it as sent; it never signs the deposit again with a fresh nonce (a second deposit)."""
    client = world.addr(world.clients[0])
    before = world.escrow.balance_of(client)
    proxy, escrow = lagging({"eth_sendRawTransaction"}, lost, reached=True)
    _deposit(world, escrow)
    assert proxy.answered_stale["eth_sendRawTransaction"] == lost
    assert world.escrow.balance_of(client) == before + 7  # one deposit, not two
    _deposit(world, escrow)  # the next send takes the next nonce
    assert world.escrow.balance_of(client) == before + 14


def test_a_priority_fee_read_stale_on_both_sources_is_a_typed_error(
    world: World, lagging: Any
) -> None:
    """The tip is the fee history's median reward, or eth_maxPriorityFeePerGas (which falls
    back to the fee history itself) when that fails: all stale, each read is asked again, then
    a typed error."""
    proxy, escrow = lagging({"eth_maxPriorityFeePerGas", "eth_feeHistory"}, 1000)
    with (
        pytest.warns(UserWarning, match="eth_feeHistory"),
        pytest.raises(StaleBlockError, match=r"^reading the priority fee: .*" + STALE),
    ):
        escrow.tx.fees(refresh=True)
    assert proxy.asked["eth_maxPriorityFeePerGas"] == ANSWERED
    assert proxy.asked["eth_feeHistory"] == 2 * ANSWERED  # ours, then the suggestion's fallback


@pytest.mark.parametrize("offset", [-1, 5], ids=["pruned", "past-the-head"])
def test_a_call_pinned_to_a_block_the_node_lacks_is_a_typed_error(
    world: World, lagging: Any, offset: int
) -> None:
    """No stale answer made up here: anvil itself refuses the block, each time it is asked."""
    proxy, escrow = lagging(set(), 0)
    fn = escrow.contract.functions.balanceOf(world.addr(world.clients[0]))
    head = world.chain.w3.eth.block_number
    assert escrow.tx.call(fn, block=head) == world.escrow.balance_of(world.addr(world.clients[0]))
    asked = proxy.asked["eth_call"]
    with pytest.raises(StaleBlockError, match=r"^calling: .*" + STALE) as caught:
        escrow.tx.call(fn, block=head + offset)
    assert proxy.asked["eth_call"] - asked == ANSWERED
    height, requested = map(int, re.findall(STALE, str(caught.value))[0])
    assert (height, requested) == (head, head + offset)


def test_a_transaction_never_mined_is_a_chain_timeout() -> None:
    with Anvil.start(accounts=1) as node:
        rpc(node.url, "evm_setAutomine", [False])
        tx = Transactor(connect(node.url), ErrorDecoder([]), receipt_timeout_s=0.3)
        key = node.keys[0]
        other = Account.create().address
        with pytest.raises(ChainTimeoutError, match=r"^transaction 0x[0-9a-f]{64} was not mined"):
            tx.send(key, other, b"")
        rpc(node.url, "evm_mine")  # mined now: the next send goes through with the next nonce
        rpc(node.url, "evm_setAutomine", [True])
        assert tx.send(key, other, b"")["status"] == 1
        assert tx.w3.eth.get_transaction_count(tx.address_of(key)) == 2  # type: ignore[arg-type]
