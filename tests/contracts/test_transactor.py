"""The transactor against a real anvil: batched reads, typed chain errors, EIP-1559 fees."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest

from contracts.binding import TASK_NONE, Chain, connect
from contracts.chain import rpc
from contracts.errors import (
    CallRevertedError,
    ChainError,
    ChainTimeoutError,
    FeeTooLowError,
    NonceTooLowError,
    TransactionRevertedError,
)
from contracts.reverts import EscrowDealNotFound, EscrowInsufficientBalance, EscrowTaskIndexTooLarge
from contracts.transactor import classify, rpc_error
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
    assert rpc_error(caught.value)[0] == -32003  # the code every refusal shares
    fee_error = classify(caught.value)
    assert isinstance(fee_error, FeeTooLowError)
    assert str(fee_error) == "fee below what the chain accepts: " + rpc_error(caught.value)[1]
    max_fee, tip = world.chain.tx.fees(refresh=True)
    world.escrow.deposit(key, 1)
    stale = dict(base, nonce=nonce, maxFeePerGas=max_fee, maxPriorityFeePerGas=tip)
    with pytest.raises(Exception) as caught:
        w3.eth.send_raw_transaction(Account.sign_transaction(stale, key).raw_transaction)
    nonce_error = classify(caught.value)
    assert isinstance(nonce_error, NonceTooLowError)
    assert str(nonce_error) == "nonce already used: nonce too low"


def test_reverts_are_typed_when_estimated_and_when_mined(world: World) -> None:
    w3, tx, escrow = world.chain.w3, world.chain.tx, world.escrow
    key = world.clients[0]
    sender = world.addr(key)
    data = escrow.contract.encode_abi("withdraw", args=[10**30])
    nonce = w3.eth.get_transaction_count(sender)  # type: ignore[arg-type]
    with pytest.raises(EscrowInsufficientBalance):  # estimated: the contract's error, unsent
        tx.send(key, escrow.address, data)
    assert w3.eth.get_transaction_count(sender) == nonce  # type: ignore[arg-type]
    with pytest.raises(CallRevertedError, match=r"^reverted with no custom error"):
        tx.send(key, escrow.address, "0xdeadbeef")  # no such function: a bare revert
    with pytest.raises(
        TransactionRevertedError, match=r"^transaction 0x[0-9a-f]{64} reverted \(gas limit 90000\)$"
    ):
        tx.send(key, escrow.address, data, gas=90_000)  # not estimated: mined, and reverted
    assert w3.eth.get_transaction_count(sender) == nonce + 1  # type: ignore[arg-type]
    assert escrow.deposit(key, 1).gas_used > 0  # the next nonce follows the reverted one
