"""Waiting for sent transactions on a chain that may drop, reorder or forget them.

A transaction counts as done once one version of it (same nonce) is mined with the role's
confirmations on the canonical chain (:mod:`contracts.tx_policy`). While it waits unmined for
``replace_after_blocks`` blocks it is signed again with higher fees; one the node forgot is
sent again. A transaction can also wait behind a nonce gap: an earlier transaction of the
same sender was dropped or reorged out, so every later one sits in the node's queue, whatever
its fee. This process keeps the signed bytes of each of its transactions until their nonce is
mined, and sends again those of the gap it finds below a waiting one.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from eth_account import Account

from contracts.errors import ChainError, ChainTimeoutError

if TYPE_CHECKING:
    from contracts.transactor import Transactor

RECEIPT_POLL_S = 0.01
"""Pause between two receipt polls (the local node mines on arrival)."""


@dataclass
class Sent:
    """One intended transaction: its sender, fields, the hashes of each version sent (same
    nonce) and the latest version's signed bytes."""

    sender: str
    tx: dict[str, Any]
    hashes: list[Any]
    raw: bytes


class PendingTransactions:
    """This process's transactions not yet known mined, by sender and nonce."""

    def __init__(self) -> None:
        self._raw: dict[str, dict[int, bytes]] = {}
        self._lock = threading.Lock()
        self.replaced = 0
        self.resent = 0

    def record(self, sender: str, tx: dict[str, Any], tx_hash: Any, raw: bytes) -> Sent:
        """Remember a transaction just sent; return what its wait follows."""
        with self._lock:
            self._raw.setdefault(sender, {})[int(tx["nonce"])] = raw
        return Sent(sender, dict(tx), [tx_hash], raw)

    def _gap(self, sender: str, mined: int, nonce: int) -> list[bytes]:
        """Forget the transactions below `mined` (their nonces are used); return the signed
        bytes this process holds for the nonces from `mined` up to `nonce`."""
        with self._lock:
            held = self._raw.get(sender, {})
            for used in [n for n in held if n < mined]:
                del held[used]
            return [held[n] for n in range(mined, nonce) if n in held]

    def wait(self, tx: Transactor, key: str, sent: Sent) -> Any:
        """Poll until one version of `sent` is mined and confirmed, unsticking it every
        `replace_after_blocks` blocks; raise `ChainTimeoutError` after `receipt_timeout_s`."""
        first = sent.hashes[0]
        what = f"waiting for the receipt of {first.to_0x_hex()}"
        deadline = time.monotonic() + tx.receipt_timeout_s
        since: int | None = None  # the block from which the latest version waits
        while True:
            for tx_hash in reversed(sent.hashes):
                receipt = tx._request(what, tx._receipt_or_none, tx_hash)
                if receipt is not None and self._confirmed(tx, receipt):
                    return receipt
                if receipt is not None:
                    break
            else:
                head = int(tx._request("reading the head", lambda: tx.w3.eth.block_number))
                if since is None:
                    since = head
                elif head - since >= tx.policy.replace_after_blocks:
                    self._unstick(tx, key, sent)
                    since = head
            if time.monotonic() >= deadline:
                raise ChainTimeoutError(
                    f"transaction {first.to_0x_hex()} was not mined and confirmed within "
                    f"{tx.receipt_timeout_s}s"
                )
            time.sleep(RECEIPT_POLL_S)  # the node pushes nothing over HTTP: poll it

    @staticmethod
    def _confirmed(tx: Transactor, receipt: Any) -> bool:
        """Return whether `receipt` has the policy's confirmations and its block is still the
        chain's block at that height (a reorg did not replace it)."""
        if tx.policy.confirmations <= 1:
            return True
        number = int(receipt["blockNumber"])
        head = int(tx._request("reading the head", lambda: tx.w3.eth.block_number))
        if head < number + tx.policy.confirmations - 1:
            return False
        block = tx._request("reading a receipt's block", tx.w3.eth.get_block, number)
        return bool(block["hash"] == receipt["blockHash"])

    def _send(self, tx: Transactor, what: str, raw: bytes) -> bool:
        try:
            tx._request(what, tx.w3.eth.send_raw_transaction, raw)
        except ChainError:
            return False  # mined meanwhile, known already, or refused: polled next
        return True

    def _unstick(self, tx: Transactor, key: str, sent: Sent) -> None:
        """The latest version waited `replace_after_blocks` unmined: send again what this
        process holds of a nonce gap below it; then sign a replacement with raised fees (same
        nonce), or at the cap send the latest again if the node forgot it."""
        nonce = int(sent.tx["nonce"])
        mined = int(
            tx._request("reading the nonce", tx.w3.eth.get_transaction_count, sent.sender, "latest")
        )
        for raw in self._gap(sent.sender, mined, nonce):
            self.resent += self._send(tx, "filling a nonce gap", raw)
        forgotten = tx._sent_before(sent.hashes[-1]) is False
        fees = tx.policy.bumped(sent.tx["maxFeePerGas"], sent.tx["maxPriorityFeePerGas"])
        if fees is None:
            if forgotten:
                self.resent += self._send(tx, "sending again", sent.raw)
            return
        sent.tx.update(maxFeePerGas=fees[0], maxPriorityFeePerGas=fees[1])
        signed = Account.sign_transaction(sent.tx, key)
        if not self._send(tx, "replacing", signed.raw_transaction):
            return
        sent.hashes.append(signed.hash)
        sent.raw = signed.raw_transaction
        with self._lock:
            self._raw.setdefault(sent.sender, {})[nonce] = sent.raw
        self.replaced += 1
        self.resent += forgotten
