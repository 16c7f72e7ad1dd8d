"""Whatever the chain does to a sent transaction, its wait ends within a few blocks in a definite,
typed outcome, and the next send takes a correct nonce.

On a real anvil that mines only when the test asks (one block at a time, each made once every
waiting send has polled the one before: the bound is in blocks, not seconds), a transaction is
dropped from the pool, mined then reorged out, its nonce taken by another transaction of the
same key (sent by another process, or put in the reorg's new blocks), refused by the node when
sent again (no funds, a base fee above the cap), or turned into one that reverts by another
party's transaction. The outcome is always one of: mined once with its confirmations
(reverted or not), `NonceTakenError`, `TransactionRefusedError`; never a version mined after
its wait gave up.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from eth_account import Account

from contracts.binding import connect
from contracts.chain import Anvil, rpc
from contracts.errors import TransactionRevertedError
from contracts.transactor import ErrorDecoder, Transactor
from contracts.tx_policy import NonceTakenError, TransactionRefusedError, TxPolicy
from tests.polling import wait_until
from tests.rpc_proxy import RpcProxy

BLOCKS = 12
"""Blocks within which every wait here must end: its replacement interval (2), its
confirmations (at most 3) and a margin. The old wait went on until its wall-clock timeout."""
POLICY = TxPolicy(confirmations=2, replace_after_blocks=2)
ONCE = bytes.fromhex("600054600c576001600055005b600080fd")
"""Runtime code that sets storage slot 0 and reverts once it is set: an action that can be done
once (as a refund of one task)."""


class Process(RpcProxy):
    """One process's transactor, reaching the node through a proxy that counts its head reads
    (one in each round of a wait)."""

    def __init__(self, node: Anvil, policy: TxPolicy = POLICY) -> None:
        super().__init__(node.url)
        self.head_reads = 0
        self._lock = threading.Lock()
        self.tx = Transactor(
            connect(self.url), ErrorDecoder([]), policy=policy, receipt_timeout_s=300
        )

    def intercept(self, body: bytes) -> tuple[int, bytes] | None:
        if json.loads(body).get("method") == "eth_blockNumber":
            with self._lock:
                self.head_reads += 1
        return None

    def send(self, key: str, to: str | None = None, gas: int | None = 21_000) -> Sending:
        return Sending(self, key, to or Account.create().address, gas)


class Sending:
    """One `send` running in a thread while the test makes blocks."""

    def __init__(self, process: Process, key: str, to: str, gas: int | None) -> None:
        self.process, self.key, self.to, self.gas = process, key, to, gas
        self.receipt: Any = None
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            self.receipt = self.process.tx.send(self.key, self.to, b"", gas=self.gas)
        except BaseException as exc:  # handed to the test
            self.error = exc

    def done(self) -> bool:
        return not self.thread.is_alive()

    def result(self) -> Any:
        assert self.done()
        if self.error is not None:
            raise self.error
        return self.receipt


@pytest.fixture
def node() -> Iterator[Anvil]:
    with Anvil.start(accounts=2, keep_history=True) as anvil:
        rpc(anvil.url, "evm_setAutomine", [False])
        yield anvil


@pytest.fixture
def processes(node: Anvil) -> Iterator[list[Process]]:
    made: list[Process] = []
    yield made
    for process in made:
        process.close()


def _pool(node: Anvil) -> dict[str, dict[str, Any]]:
    content = rpc(node.url, "txpool_content")["pending"]
    return {t["hash"]: t for by_nonce in content.values() for t in by_nonce.values()}


def _in_pool(node: Anvil, count: int = 1) -> list[str]:
    wait_until(lambda: len(_pool(node)) >= count, 60, "the transactions in the pool")
    return list(_pool(node))


def _count(node: Anvil, key: str) -> int:
    return int(
        rpc(node.url, "eth_getTransactionCount", [Account.from_key(key).address, "latest"]), 16
    )


def _mine_until_done(
    node: Anvil, sendings: list[Sending], *, base_fee: int | None = None, blocks: int = BLOCKS
) -> None:
    """Make blocks one at a time, each once every waiting send has read the head after the one
    before; fail if some send still waits after `blocks` blocks."""
    for _ in range(blocks):
        waiting = [s for s in sendings if not s.done()]
        if not waiting:
            return
        seen = [s.process.head_reads for s in waiting]
        if base_fee is not None:
            rpc(node.url, "anvil_setNextBlockBaseFeePerGas", [hex(base_fee)])
        rpc(node.url, "evm_mine")
        for sending, before in zip(waiting, seen, strict=True):
            wait_until(
                lambda s=sending, b=before: s.done() or s.process.head_reads >= b + 2,  # type: ignore[misc]
                60,
                "the wait to read the new head",
            )
    stuck = [s for s in sendings if not s.done()]
    assert not stuck, f"{len(stuck)} wait(s) still running after {blocks} blocks"


def _start(processes: list[Process], node: Anvil, policy: TxPolicy = POLICY) -> Process:
    process = Process(node, policy)
    processes.append(process)
    return process


def _signed(node: Anvil, key: str, nonce: int, fee: int, to: str | None = None) -> Any:
    tx = {"to": to or Account.create().address, "value": 7, "gas": 50_000, "nonce": nonce}
    tx.update(maxFeePerGas=fee, maxPriorityFeePerGas=fee // 2, chainId=node.chain_id)
    return Account.sign_transaction(tx, key)


def _next_send_uses_the_next_nonce(node: Anvil, process: Process, key: str, nonce: int) -> None:
    after = process.send(key)
    _mine_until_done(node, [after])
    receipt = after.result()
    mined = process.tx.w3.eth.get_transaction(receipt["transactionHash"])
    assert receipt["status"] == 1 and mined["nonce"] == nonce


@pytest.mark.parametrize("how", ["dropped, then sent by another process", "replaced in the pool"])
def test_a_nonce_another_process_takes_ends_the_wait_typed(
    node: Anvil, processes: list[Process], how: str
) -> None:
    """The client's refund waits while another process of the same key takes its nonce: the
    wait ends `NonceTakenError` once that transaction has its confirmations, the refund is never
    mined, and this process's next send takes the nonce after."""
    key = node.keys[0]
    ours = _start(processes, node)
    sending = ours.send(key)
    (original,) = _in_pool(node)
    others: list[Sending] = []
    if how.startswith("dropped"):
        rpc(node.url, "anvil_dropTransaction", [original])
        others.append(_start(processes, node).send(key))  # reads nonce 0 from the node
        _in_pool(node)
    else:
        fee = 2 * int(_pool(node)[original]["maxFeePerGas"], 16)
        taker = _signed(node, key, 0, fee)
        rpc(node.url, "eth_sendRawTransaction", ["0x" + taker.raw_transaction.hex()])
        assert list(_pool(node)) == ["0x" + taker.hash.hex()]  # it replaced ours in the pool
    _mine_until_done(node, [sending, *others])
    with pytest.raises(NonceTakenError, match="nonce 0"):
        sending.result()
    for other in others:
        assert other.result()["status"] == 1
    if not others:
        assert rpc(node.url, "eth_getTransactionReceipt", ["0x" + taker.hash.hex()])["status"]
    assert _count(node, key) == 1  # nonce 0 mined once, by the other transaction
    _next_send_uses_the_next_nonce(node, ours, key, 1)


def test_a_transaction_reorged_out_for_another_at_its_nonce_ends_the_wait_typed(
    node: Anvil, processes: list[Process]
) -> None:
    """Mined, then a reorg replaces its block with one holding another transaction of the same
    key at its nonce: `NonceTakenError` once that one has the confirmations."""
    key = node.keys[0]
    ours = _start(processes, node, TxPolicy(confirmations=3, replace_after_blocks=2))
    sending = ours.send(key)
    _in_pool(node)
    rpc(node.url, "evm_mine")  # mined: 1 confirmation of 3
    wait_until(lambda: _count(node, key) == 1, 60, "the transaction mined")
    other = _signed(node, key, 0, 10**10)
    rpc(node.url, "anvil_reorg", [1, [["0x" + other.raw_transaction.hex(), 0]]])
    _mine_until_done(node, [sending])
    with pytest.raises(NonceTakenError):
        sending.result()
    assert rpc(node.url, "eth_getTransactionReceipt", ["0x" + other.hash.hex()])["status"]
    _next_send_uses_the_next_nonce(node, ours, key, 1)


@pytest.mark.parametrize("why", ["no funds", "a base fee above the cap"])
def test_a_forgotten_transaction_the_node_refuses_ends_the_wait_typed(
    node: Anvil, processes: list[Process], why: str
) -> None:
    """Dropped from the pool, then refused when sent again: `TransactionRefusedError`, nothing
    of it is sent after, and the next send takes its nonce."""
    key = node.keys[0]
    cap = 10**11
    ours = _start(processes, node, TxPolicy(replace_after_blocks=2, max_fee_wei=cap))
    sending = ours.send(key)
    (original,) = _in_pool(node)
    rpc(node.url, "anvil_dropTransaction", [original])
    sender = ours.tx.address_of(key)
    if why == "no funds":
        balance = rpc(node.url, "eth_getBalance", [sender, "latest"])
        rpc(node.url, "anvil_setBalance", [sender, "0x0"])
        _mine_until_done(node, [sending])
        rpc(node.url, "anvil_setBalance", [sender, balance])
    else:
        _mine_until_done(node, [sending], base_fee=10 * cap)
    with pytest.raises(TransactionRefusedError):
        sending.result()
    for _ in range(30):  # cheap blocks again; nothing of the refused one comes back
        rpc(node.url, "evm_mine")
    assert _count(node, key) == 0
    _next_send_uses_the_next_nonce(node, ours, key, 0)


def test_a_forgotten_transaction_that_now_reverts_is_mined_once_reverted(
    node: Anvil, processes: list[Process]
) -> None:
    """A one-time action (the client's refund) is dropped from the pool while another party
    does it (the provider's refund of the same task): sent again, it is mined once, reverted,
    and the wait ends `TransactionRevertedError`."""
    once = Account.create().address
    rpc(node.url, "anvil_setCode", [once, "0x" + ONCE.hex()])
    key, party = node.keys
    ours = _start(processes, node)
    sending = ours.send(key, to=once, gas=None)  # estimated: it would succeed now
    (original,) = _in_pool(node)
    rpc(node.url, "anvil_dropTransaction", [original])
    theirs = _signed(node, party, 0, 10**10, to=once)
    rpc(node.url, "eth_sendRawTransaction", ["0x" + theirs.raw_transaction.hex()])
    _mine_until_done(node, [sending])
    with pytest.raises(TransactionRevertedError):
        sending.result()
    assert _count(node, key) == 1  # its nonce used once: one version mined
    assert rpc(node.url, "eth_getStorageAt", [once, "0x0", "latest"]).endswith("1")


def test_a_send_never_takes_the_nonce_of_a_pending_transaction_it_did_not_make(
    node: Anvil, processes: list[Process]
) -> None:
    """Two transactors of one key (the client's escrow and token bindings, or two processes):
    one sent at the nonce the other's cache holds, at lower fees. The other's next send takes
    the nonce after it, instead of replacing it unseen: both are mined."""
    key = node.keys[0]
    ours = _start(processes, node)
    first = ours.send(key)
    _in_pool(node)
    _mine_until_done(node, [first])
    first.result()  # nonce 0: this transactor's cache says 1 is next
    base = int(rpc(node.url, "eth_getBlockByNumber", ["pending", False])["baseFeePerGas"], 16)
    theirs = _signed(node, key, 1, base + 2)  # the lowest fees the node takes
    rpc(node.url, "eth_sendRawTransaction", ["0x" + theirs.raw_transaction.hex()])
    assert ours.tx.fees()[0] > 2 * (base + 2)  # ours would replace theirs at that nonce
    second = ours.send(key)
    theirs_hash = "0x" + theirs.hash.hex()
    wait_until(lambda: bool(set(_pool(node)) - {theirs_hash}), 60, "the second send in the pool")
    assert theirs_hash in _pool(node)  # not replaced
    _mine_until_done(node, [second])
    receipt = second.result()
    assert ours.tx.w3.eth.get_transaction(receipt["transactionHash"])["nonce"] == 2
    assert rpc(node.url, "eth_getTransactionReceipt", [theirs_hash]) is not None
    assert _count(node, key) == 3


def test_a_transaction_behind_a_nonce_gap_no_one_holds_is_mined(
    node: Anvil, processes: list[Process]
) -> None:
    """Another process of the key sent at nonce 0 and ended (killed); this one sent at 1 behind
    it. The node drops the first (and with it every later one of the sender): this one is sent
    again but queued behind the gap. Its wait fills the gap with a transfer of nothing to the
    sender and is mined; the first transaction is never mined."""
    key = node.keys[0]
    gone = _signed(node, key, 0, 10**10)
    rpc(node.url, "eth_sendRawTransaction", ["0x" + gone.raw_transaction.hex()])
    ours = _start(processes, node)
    sending = ours.send(key)
    _in_pool(node, 2)
    rpc(node.url, "anvil_dropTransaction", ["0x" + gone.hash.hex()])
    assert not _pool(node)  # the later one went with it
    _mine_until_done(node, [sending])
    receipt = sending.result()
    assert ours.tx.w3.eth.get_transaction(receipt["transactionHash"])["nonce"] == 1
    assert rpc(node.url, "eth_getTransactionReceipt", ["0x" + gone.hash.hex()]) is None
    assert _count(node, key) == 2 and ours.tx.filled == 1


def test_a_forgotten_transaction_priced_out_by_a_fee_spike_is_signed_again_and_mined_once(
    node: Anvil, processes: list[Process]
) -> None:
    """Dropped from the pool while the base fee rose far above its fee cap (no cap of the
    role's): sent again it is refused for its fees, so it is signed again on its nonce with the
    fees the chain asks now, and mined once."""
    key = node.keys[0]
    ours = _start(processes, node)
    sending = ours.send(key)
    (original,) = _in_pool(node)
    spike = 20 * int(_pool(node)[original]["maxFeePerGas"], 16)
    rpc(node.url, "anvil_dropTransaction", [original])
    _mine_until_done(node, [sending], base_fee=spike)
    receipt = sending.result()
    assert receipt["status"] == 1 and receipt["transactionHash"].to_0x_hex() != original
    assert _count(node, key) == 1 and ours.tx.replaced == 1


def test_two_transactions_of_one_process_reorged_out_are_each_mined_once(
    node: Anvil, processes: list[Process]
) -> None:
    """Both mined in one block, then a reorg replaces it with an empty one: each wait sends
    its own again (the later one's also fills the gap below it from the bytes kept), and
    each nonce is mined once."""
    key = node.keys[0]
    ours = _start(processes, node, TxPolicy(confirmations=3, replace_after_blocks=2))
    first = ours.send(key)
    _in_pool(node)
    second = ours.send(key)
    _in_pool(node, 2)
    rpc(node.url, "evm_mine")
    wait_until(lambda: _count(node, key) == 2, 60, "both mined")
    rpc(node.url, "anvil_reorg", [1, []])
    assert _count(node, key) == 0
    _mine_until_done(node, [first, second])
    assert first.result()["status"] == 1 and second.result()["status"] == 1
    assert _count(node, key) == 2
