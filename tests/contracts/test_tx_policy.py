"""Sending on a chain that does not mine at once, on a real anvil whose blocks the test makes:
a transaction priced out of the blocks is replaced with higher fees (same nonce, mined once), a
transaction dropped from the pool or reorged out is sent again, a receipt counts only with its
confirmations, and a base fee above the role's cap sends nothing."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest
from eth_account import Account

from contracts.binding import connect
from contracts.chain import Anvil, rpc
from contracts.errors import ChainTimeoutError
from contracts.transactor import ErrorDecoder, Transactor
from contracts.tx_policy import FeeCapError, TxPolicy
from tests.polling import wait_until


@pytest.fixture
def node() -> Iterator[Anvil]:
    with Anvil.start(accounts=2, keep_history=True) as anvil:
        rpc(anvil.url, "evm_setAutomine", [False])
        yield anvil


class Sending:
    """One `send` running in a thread while the test makes blocks."""

    def __init__(self, tx: Transactor, key: str) -> None:
        self.tx, self.key = tx, key
        self.to = Account.create().address
        self.receipt: Any = None
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            self.receipt = self.tx.send(self.key, self.to, b"", gas=21_000)
        except BaseException as exc:  # handed to the test
            self.error = exc

    def done(self) -> bool:
        return not self.thread.is_alive()

    def result(self) -> Any:
        wait_until(self.done, 60, "the send to return")
        if self.error is not None:
            raise self.error
        return self.receipt


def _pending(node: Anvil) -> list[str]:
    content = rpc(node.url, "txpool_content")
    return [tx["hash"] for by_nonce in content["pending"].values() for tx in by_nonce.values()]


def _mine(node: Anvil, *, base_fee: int | None = None) -> None:
    if base_fee is not None:
        rpc(node.url, "anvil_setNextBlockBaseFeePerGas", [hex(base_fee)])
    rpc(node.url, "evm_mine")


def _transactor(node: Anvil, policy: TxPolicy) -> Transactor:
    return Transactor(connect(node.url), ErrorDecoder([]), policy=policy, receipt_timeout_s=120)


def test_a_transaction_priced_out_is_replaced_and_mined_once(node: Anvil) -> None:
    tx = _transactor(node, TxPolicy(replace_after_blocks=2))
    key = node.keys[0]
    sending = Sending(tx, key)
    wait_until(lambda: bool(_pending(node)), 60, "the transaction in the pool")
    original = _pending(node)[0]
    max_fee, _ = tx.fees()
    while tx.replaced == 0:  # blocks whose base fee the original's cap cannot pay
        _mine(node, base_fee=max_fee + 1)
    _mine(node, base_fee=max_fee + 1)  # the replacement's cap (12.5% more) pays it
    receipt = sending.result()
    assert receipt["status"] == 1 and receipt["transactionHash"].to_0x_hex() != original
    assert tx.w3.eth.get_transaction_count(tx.address_of(key)) == 1  # one nonce, one effect
    assert tx.w3.eth.get_balance(sending.to) == 0  # type: ignore[arg-type]
    assert tx.replaced >= 1


def test_a_dropped_transaction_is_sent_again(node: Anvil) -> None:
    tx = _transactor(node, TxPolicy(replace_after_blocks=2))
    key = node.keys[0]
    sending = Sending(tx, key)
    wait_until(lambda: bool(_pending(node)), 60, "the transaction in the pool")
    original = _pending(node)[0]
    rpc(node.url, "anvil_dropTransaction", [original])
    while tx.resent == 0:
        _mine(node)  # empty blocks: the dropped transaction is not in them
    _mine(node)
    receipt = sending.result()
    assert receipt["status"] == 1 and tx.resent >= 1
    assert tx.w3.eth.get_transaction_count(tx.address_of(key)) == 1  # one nonce, one effect


def test_a_receipt_counts_only_with_its_confirmations_and_a_reorged_one_is_sent_again(
    node: Anvil,
) -> None:
    tx = _transactor(node, TxPolicy(confirmations=3, replace_after_blocks=2))
    key = node.keys[0]
    sending = Sending(tx, key)
    wait_until(lambda: bool(_pending(node)), 60, "the transaction in the pool")
    _mine(node)  # mined: 1 confirmation
    _mine(node)  # 2
    assert not sending.done()
    # a reorg of depth 2 replaces both blocks with empty ones: the transaction is gone
    rpc(node.url, "anvil_reorg", [2, []])
    assert tx.w3.eth.get_transaction_count(tx.address_of(key)) == 0
    while tx.resent == 0 and not sending.done():
        _mine(node)
    while not sending.done():
        _mine(node)
    receipt = sending.result()
    assert receipt["status"] == 1 and tx.resent >= 1
    head = tx.w3.eth.block_number
    assert head >= receipt["blockNumber"] + 2
    assert tx.w3.eth.get_block(receipt["blockNumber"])["hash"] == receipt["blockHash"]
    assert tx.w3.eth.get_transaction_count(tx.address_of(key)) == 1


def test_a_base_fee_above_the_cap_sends_nothing(node: Anvil) -> None:
    rpc(node.url, "evm_setAutomine", [True])
    tx = _transactor(node, TxPolicy(max_fee_wei=10))
    key = node.keys[0]
    with pytest.raises(FeeCapError, match="above this role's cap of 10"):
        tx.send(key, Account.create().address, b"", gas=21_000)
    assert tx.w3.eth.get_transaction_count(tx.address_of(key)) == 0


def test_policy_fees_respect_the_cap() -> None:
    policy = TxPolicy(max_fee_wei=100)
    assert policy.fees(10, 5) == (25, 5)
    assert policy.fees(45, 20) == (100, 20)  # 110 capped; the tip still fits under the cap
    assert policy.fees(95, 20) == (100, 5)  # the tip shrinks to what the cap leaves
    assert policy.bumped(80, 8) == (90, 9)
    assert policy.bumped(95, 8) is None  # no replacement above the cap
    with pytest.raises(ValueError, match="confirmations"):
        TxPolicy(confirmations=0)


def test_a_nonce_gap_left_by_a_dropped_transaction_is_filled_from_the_bytes_kept(
    node: Anvil,
) -> None:
    """The first transaction's wait gave up; then it was dropped from the pool while a second
    one of the same sender waited behind it (queued: its nonce cannot run). The second one's
    wait sends the first again from the signed bytes this process kept: both are mined."""
    tx = _transactor(node, TxPolicy(replace_after_blocks=2))
    key = node.keys[0]
    tx.receipt_timeout_s = 0.5  # no block is made: the first wait gives up
    with pytest.raises(ChainTimeoutError):
        tx.send(key, Account.create().address, b"", gas=21_000)
    tx.receipt_timeout_s = 120
    sending = Sending(tx, key)
    wait_until(lambda: len(_pending(node)) == 2, 60, "both transactions in the pool")
    content = rpc(node.url, "txpool_content")["pending"]
    first = next(t["hash"] for by in content.values() for t in by.values() if t["nonce"] == "0x0")
    rpc(node.url, "anvil_dropTransaction", [first])
    while not sending.done():
        _mine(node)
    assert sending.result()["status"] == 1 and tx.resent >= 1
    assert tx.w3.eth.get_transaction_count(tx.address_of(key)) == 2  # the gap filled, once each
