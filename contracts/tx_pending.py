"""Waiting for sent transactions on a chain that may drop, reorder or forget them.

A transaction counts as done once one version of it (same nonce) is mined with the role's
confirmations on the canonical chain (:mod:`contracts.tx_policy`). While it waits unmined for
``replace_after_blocks`` blocks it is signed again with higher fees; one the node forgot is
sent again. A transaction can also wait behind a nonce gap: an earlier transaction of the
same sender was dropped or reorged out, so every later one sits in the node's queue, whatever
its fee. This process keeps the signed bytes of each of its transactions until their nonce is
mined, and sends again those of the gap it finds below a waiting one. A gap whose transaction
no one holds (another process's, dropped after that process ended) is filled with a transfer
of nothing to the sender itself: should that transaction come back, its nonce is used and its
own wait ends `NonceTakenError`; nothing is done twice.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from eth_account import Account

from contracts.errors import (
    ChainError,
    ChainTimeoutError,
    FeeTooLowError,
    NonceTooLowError,
    StaleBlockError,
)
from contracts.tx_policy import (
    FeeCapError,
    KnownTransactionError,
    NonceTakenError,
    ReplacementUnderpricedError,
    TransactionRefusedError,
)

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
        self.filled = 0

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
        `replace_after_blocks` blocks. Raise `NonceTakenError` once another transaction holds
        its nonce with the confirmations, `TransactionRefusedError` when the node forgot it and
        refuses it again, and `ChainTimeoutError` after `receipt_timeout_s` (a version the
        chain keeps in its pool and never mines: priced out at the fee cap)."""
        first = sent.hashes[0]
        deadline = time.monotonic() + tx.receipt_timeout_s
        since: int | None = None  # the block from which the latest version waits
        checked: int | None = None  # the head at which the nonce was last read
        while True:
            receipt = self._receipt(tx, sent)
            confirmed = None if receipt is None else self._confirmed(tx, receipt)
            if confirmed:
                return receipt
            if confirmed is None:  # not mined, or in a block a reorg replaced
                head = int(tx._request("reading the head", lambda: tx.w3.eth.block_number))
                if since is None:
                    since = checked = head
                elif head != checked:  # a block since the last look: whose is the nonce?
                    checked = head
                    self._check_nonce(tx, sent, head)
                if head - since >= tx.policy.replace_after_blocks:
                    self._unstick(tx, key, sent)
                    since = head
            if time.monotonic() >= deadline:
                raise ChainTimeoutError(
                    f"transaction {first.to_0x_hex()} was not mined and confirmed within "
                    f"{tx.receipt_timeout_s}s"
                )
            time.sleep(RECEIPT_POLL_S)  # the node pushes nothing over HTTP: poll it

    @staticmethod
    def _receipt(tx: Transactor, sent: Sent) -> Any:
        """Return the receipt of the version of `sent` the node has mined, or None."""
        what = f"waiting for the receipt of {sent.hashes[0].to_0x_hex()}"
        for tx_hash in reversed(sent.hashes):
            receipt = tx._request(what, tx._receipt_or_none, tx_hash)
            if receipt is not None:
                return receipt
        return None

    def _check_nonce(self, tx: Transactor, sent: Sent, head: int) -> None:
        """Raise `NonceTakenError` when the sender's nonce of `sent` is used in a block with the
        policy's confirmations (read at that block: a reorg shallower than them cannot undo it)
        and no version of `sent` is mined: another transaction holds it for good."""
        nonce = int(sent.tx["nonce"])
        count = tx._request("reading the nonce", tx.w3.eth.get_transaction_count, sent.sender)
        if int(count) <= nonce:
            return
        depth = head - tx.policy.confirmations + 1
        if depth < 0:
            return
        if tx.policy.confirmations > 1:
            try:
                count = tx._request(
                    "reading the nonce confirmed",
                    tx.w3.eth.get_transaction_count,
                    sent.sender,
                    depth,
                )
            except StaleBlockError:
                return  # a node without that block's state cannot say yet: waited on
            if int(count) <= nonce:
                return
        if self._receipt(tx, sent) is not None:
            return  # one version was mined meanwhile: the wait reads it
        if any(tx._sent_before(tx_hash) is not False for tx_hash in sent.hashes):
            return  # the node still knows a version (or cannot say): not given up on that
        self._forget(sent)
        raise NonceTakenError(
            f"nonce {nonce} of {sent.sender} went to another transaction (mined by block "
            f"{depth}); transaction {sent.hashes[0].to_0x_hex()} was not mined and will not be"
        )

    def _forget(self, sent: Sent) -> None:
        """Drop the signed bytes of `sent`: no gap filling sends it again."""
        with self._lock:
            held = self._raw.get(sent.sender, {})
            if held.get(int(sent.tx["nonce"])) == sent.raw:
                del held[int(sent.tx["nonce"])]

    def _refuse(self, sent: Sent, error: ChainError) -> TransactionRefusedError:
        self._forget(sent)
        return TransactionRefusedError(
            f"transaction {sent.hashes[0].to_0x_hex()} (nonce {int(sent.tx['nonce'])}) is in "
            f"no pool and the node refuses it again: {error}"
        )

    @staticmethod
    def _confirmed(tx: Transactor, receipt: Any) -> bool | None:
        """Return whether `receipt` has the policy's confirmations with its block still the
        chain's block at that height; None when a reorg replaced that block (a node that still
        answers with the receipt of a block no longer on the chain: not mined after all)."""
        if tx.policy.confirmations <= 1:
            return True
        number = int(receipt["blockNumber"])
        head = int(tx._request("reading the head", lambda: tx.w3.eth.block_number))
        if head < number + tx.policy.confirmations - 1:
            return False
        block = tx._request("reading a receipt's block", tx.w3.eth.get_block, number)
        return True if block["hash"] == receipt["blockHash"] else None

    def _send(self, tx: Transactor, what: str, raw: bytes) -> bool:
        try:
            tx._request(what, tx.w3.eth.send_raw_transaction, raw)
        except ChainError:
            return False  # mined meanwhile, known already, or refused: polled next
        return True

    def _unstick(self, tx: Transactor, key: str, sent: Sent) -> None:
        """The latest version waited `replace_after_blocks` unmined: send again what this
        process holds of a nonce gap below it. A latest version the node forgot (dropped, or
        reorged out) is sent again as it is: that replaces no other transaction of the sender
        the node holds at this nonce (its own or another process's: once mined, the nonce
        check ends this wait). One the node still holds, or forgot and refuses for a base fee
        above its cap, is signed again with raised fees, never above the policy's cap. A
        forgotten one the node refuses for anything else (funds, gas), or whose fees the cap
        cannot raise to the base fee, is given up (`TransactionRefusedError`)."""
        nonce = int(sent.tx["nonce"])
        mined = int(
            tx._request("reading the nonce", tx.w3.eth.get_transaction_count, sent.sender, "latest")
        )
        for raw in self._gap(sent.sender, mined, nonce):
            self.resent += self._send(tx, "filling a nonce gap", raw)
        if mined < nonce:
            self._fill_abandoned(tx, key, sent.sender, nonce)
        forgotten = tx._sent_before(sent.hashes[-1]) is False
        if forgotten:
            try:
                tx._request("sending again", tx.w3.eth.send_raw_transaction, sent.raw)
            except (NonceTooLowError, ReplacementUnderpricedError, KnownTransactionError):
                return  # used, held by another transaction of the sender, or back meanwhile
            except FeeTooLowError:
                pass  # the base fee rose above its cap: signed again with fees that pay it
            except ChainError as exc:
                if tx.refused_by_node(exc):
                    raise self._refuse(sent, exc) from exc
                return  # the node did not answer: tried again after the next blocks
            else:
                self.resent += 1
                return
        fees = self._raised_fees(tx, sent, forgotten)
        if fees is None:
            if forgotten:
                raise self._refuse(sent, FeeTooLowError("the fee cap leaves no fee it accepts"))
            return
        sent.tx.update(maxFeePerGas=fees[0], maxPriorityFeePerGas=fees[1])
        signed = Account.sign_transaction(sent.tx, key)
        try:
            tx._request("replacing", tx.w3.eth.send_raw_transaction, signed.raw_transaction)
        except (NonceTooLowError, ReplacementUnderpricedError, KnownTransactionError):
            return
        except ChainError as exc:
            if forgotten and tx.refused_by_node(exc):
                raise self._refuse(sent, exc) from exc
            return
        sent.hashes.append(signed.hash)
        sent.raw = signed.raw_transaction
        with self._lock:
            self._raw.setdefault(sent.sender, {})[nonce] = sent.raw
        self.replaced += 1
        self.resent += forgotten

    def _fill_abandoned(self, tx: Transactor, key: str, sender: str, nonce: int) -> None:
        """Fill the lowest nonce below `nonce` the node holds no transaction for and this
        process holds no bytes of (what it holds was just sent again) with a transfer of
        nothing to `sender`, under the transactor's lock (no send of its own races it)."""
        with tx._lock:
            free = int(
                tx._request(
                    "reading the pending nonce", tx.w3.eth.get_transaction_count, sender, "pending"
                )
            )
            with self._lock:
                if free >= nonce or free in self._raw.get(sender, {}):
                    return
            try:
                max_fee, tip = tx.fees(refresh=True)
            except FeeCapError:
                return  # nothing is mined at these base fees anyway
            filler = {"to": sender, "value": 0, "data": b"", "gas": 21_000, "nonce": free}
            filler.update(chainId=tx.chain_id, maxFeePerGas=max_fee, maxPriorityFeePerGas=tip)
            signed = Account.sign_transaction(filler, key)
            self.filled += self._send(tx, "filling an abandoned nonce", signed.raw_transaction)

    @staticmethod
    def _raised_fees(tx: Transactor, sent: Sent, forgotten: bool) -> tuple[int, int] | None:
        """Return the fees of a replacement of `sent`: raised by the policy's bump, and for one
        the node refused for its fees at least the fees the chain asks now; None when the cap
        leaves no higher fee."""
        max_fee = int(sent.tx["maxFeePerGas"])
        fees = tx.policy.bumped(max_fee, int(sent.tx["maxPriorityFeePerGas"]))
        if not forgotten:
            return fees
        try:
            now = tx.fees(refresh=True)
        except FeeCapError:
            return None
        higher = [f for f in (fees, now) if f is not None and f[0] > max_fee]
        return max(higher, key=lambda f: f[0]) if higher else None
