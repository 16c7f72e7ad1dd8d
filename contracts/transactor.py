"""Signing and sending transactions for local keys, with chain errors sorted into types.

Every transaction is estimated first (so a revert surfaces as the typed exception named after
the contract's custom error), signed locally with EIP-1559 fees (a real priority fee: the
chain's suggestion, and a cap of twice the base fee above it) and sent raw with nonces tracked
per sender. Every request the transactor makes to the node (chain id, fee and nonce reads, gas
estimates, calls, sends, receipt polls) goes through one gate, `Transactor._request`: an answer
for a block the node does not have is asked again a few times with a short backoff, then
raised as `StaleBlockError`; any other failure is classified once, here: a fee below the base
fee, a nonce already used, a revert, a timeout — each its own `EscrowError` subclass, so
callers and retries act on types, not on the text of a message.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any

import requests
from eth_abi.abi import decode as abi_decode
from eth_account import Account
from eth_utils.abi import function_abi_to_4byte_selector
from eth_utils.address import to_checksum_address
from web3 import Web3
from web3.exceptions import (
    BadFunctionCallOutput,
    BadResponseFormat,
    ContractLogicError,
    ProviderConnectionError,
    RequestTimedOut,
    TimeExhausted,
    TooManyRequests,
    TransactionIndexingInProgress,
    TransactionNotFound,
    Web3RPCError,
)
from web3.types import BlockIdentifier

from contracts.errors import (
    CallRevertedError,
    ChainError,
    ChainTimeoutError,
    ContractRevert,
    EscrowError,
    FeeTooLowError,
    NonceTooLowError,
    StaleBlockError,
    TransactionRevertedError,
)
from contracts.reverts import REVERTS
from contracts.tx_pending import PendingTransactions, Sent
from contracts.tx_policy import (
    FEE_HISTORY_BLOCKS,
    KnownTransactionError,
    NonceTakenError,
    ReplacementUnderpricedError,
    TransactionRefusedError,
    TxPolicy,
    tip_from_history,
)

GAS_MARGIN = 1.2
RECEIPT_TIMEOUT_S = 60.0
"""How long a sent transaction may take to be mined before `ChainTimeoutError`."""
STALE_BLOCK_RETRIES = 3
"""Times a request is asked again when the node answers for a block it does not have."""
STALE_BLOCK_BACKOFF_S = 0.05
"""The pause before the first such retry; the n-th waits n times as long."""


@dataclass(frozen=True)
class Event:
    """A decoded contract event."""

    name: str
    args: dict[str, Any]


@dataclass(frozen=True)
class TxResult:
    """A mined transaction: its hash, gas used and decoded events."""

    tx_hash: str
    gas_used: int
    block_number: int
    events: tuple[Event, ...]
    contract_address: str | None = None

    def event(self, name: str) -> Event:
        """Return the first event called `name`; raise KeyError if none."""
        for event in self.events:
            if event.name == name:
                return event
        raise KeyError(name)


class ErrorDecoder:
    """Turn revert data into the typed exception named after the custom error."""

    def __init__(self, abis: list[list[dict[str, Any]]]) -> None:
        self._by_selector: dict[bytes, tuple[str, list[str], list[str]]] = {}
        for abi in abis:
            for item in abi:
                if item["type"] == "error":
                    selector = selector_of(item)
                    types = [i["type"] for i in item["inputs"]]
                    names = [i["name"] for i in item["inputs"]]
                    self._by_selector[selector] = (item["name"], types, names)

    def decode(self, data: str | bytes | None) -> ContractRevert | None:
        """Return the typed revert for `data`, or None when it is no known custom error."""
        if data is None:
            return None
        raw = bytes.fromhex(data.removeprefix("0x")) if isinstance(data, str) else data
        entry = self._by_selector.get(raw[:4])
        if entry is None:
            return None
        name, types, names = entry
        values = abi_decode(types, raw[4:])
        args = {n: plain(t, v) for n, t, v in zip(names, types, values, strict=True)}
        return REVERTS.get(name, ContractRevert)(name, args)


def selector_of(item: dict[str, Any]) -> bytes:
    """Return the 4-byte selector of an ABI function or error entry."""
    return bytes(function_abi_to_4byte_selector(item))  # type: ignore[arg-type]


def plain(kind: str, value: Any) -> Any:
    """Return an ABI-decoded value in the form the bindings hand out (checksums, 0x hex)."""
    if kind == "address":
        return to_checksum_address(value)
    if isinstance(value, bytes):
        return "0x" + value.hex()
    return value


def rpc_error(exc: Exception) -> tuple[int | None, str]:
    """Return the JSON-RPC error code and message the node answered with, read from the reply
    web3 keeps; (None, the exception's text) when there is no such reply."""
    reply = getattr(exc, "rpc_response", None)
    error = reply.get("error") if isinstance(reply, dict) else None
    if isinstance(error, dict):
        code = error.get("code")
        return (code if isinstance(code, int) else None), str(error.get("message", ""))
    return None, str(exc)


TX_REJECTED_CODES = frozenset({-32000, -32003})
"""JSON-RPC codes a node gives a transaction it refuses: -32003 (EIP-1474 "transaction
rejected", anvil) and -32000 (geth's generic server error)."""


def classify(exc: Exception) -> ChainError:
    """Return the typed chain error for what a node or the transport raised."""
    if isinstance(exc, ChainError):
        return exc
    if isinstance(exc, TimeExhausted | RequestTimedOut | requests.Timeout | TimeoutError):
        return ChainTimeoutError(f"the chain did not answer in time: {exc}")
    if isinstance(exc, ContractLogicError):  # web3's type for a revert answer (code 3, data)
        return CallRevertedError(f"reverted with no custom error the contracts declare: {exc}")
    code, message = rpc_error(exc)
    if stale_block(exc):
        return StaleBlockError(f"the node has no state for the block asked for: {message}")
    if isinstance(exc, Web3RPCError) and (code is None or code in TX_REJECTED_CODES):
        # Every refusal of a transaction shares these codes: the node's message (the reply's
        # own field, not the exception's text) is the only discriminant it offers, read here.
        lowered = message.lower()
        if "replacement" in lowered and "underpriced" in lowered:
            return ReplacementUnderpricedError(f"another transaction holds the nonce: {message}")
        if "already imported" in lowered or "already known" in lowered:
            return KnownTransactionError(f"the node holds this transaction already: {message}")
        if "base fee" in lowered or "fee cap" in lowered or "underpriced" in lowered:
            return FeeTooLowError(f"fee below what the chain accepts: {message}")
        if "nonce too low" in lowered or "nonce has already been used" in lowered:
            return NonceTooLowError(f"nonce already used: {message}")
    if isinstance(exc, requests.ConnectionError | ConnectionError):
        return ChainError(f"the chain cannot be reached: {exc}")
    return ChainError(str(exc))


def stale_block(exc: Exception) -> bool:
    """Return whether the node refused a request for a block it does not have: pruned from its
    history, or past its head when it lags, or replaced while it answered ("latest" under
    load). anvil names it: ``BlockOutOfRangeError: block height is N but requested was M``."""
    message = rpc_error(exc)[1]
    return "BlockOutOfRangeError" in message or "block height is" in message.lower()


_FAILURES = (
    Web3RPCError,
    ContractLogicError,
    TimeExhausted,
    BadFunctionCallOutput,
    BadResponseFormat,
    ProviderConnectionError,
    TooManyRequests,
    requests.RequestException,
    OSError,
)
"""What a request to the node raises when the node or the transport fails (not a misuse of the
library, which is left to propagate)."""


class Transactor:
    """Sign and send transactions for local keys, tracking nonces per sender."""

    def __init__(
        self,
        w3: Web3,
        decoder: ErrorDecoder,
        *,
        receipt_timeout_s: float = RECEIPT_TIMEOUT_S,
        policy: TxPolicy | None = None,
    ) -> None:
        self.w3 = w3
        self.policy = policy or TxPolicy()
        self._pending = PendingTransactions()
        self._decoder = decoder
        self._nonces: dict[str, int] = {}
        self._lock = threading.Lock()
        self._addresses: dict[str, str] = {}
        self._fees: tuple[int, int] | None = None
        self.receipt_timeout_s = receipt_timeout_s
        self.chain_id = int(self._request("reading the chain id", lambda: w3.eth.chain_id))

    def send(self, key: str, to: str | None, data: bytes | str, gas: int | None = None) -> Any:
        """Send a transaction, wait for its receipt and return it; raise the typed error."""
        sender = self.address_of(key)
        tx: dict[str, Any] = {"from": sender, "data": data, "value": 0}
        if to is not None:
            tx["to"] = to
        with self._lock:
            if gas is None:
                estimate = self._request("estimating gas", self.w3.eth.estimate_gas, tx, "pending")
                gas = int(estimate * GAS_MARGIN)
            del tx["from"]
            tx.update(gas=gas, chainId=self.chain_id)
            sent = self._send_raw(key, sender, tx)
        try:
            receipt = self._pending.wait(self, key, sent)
        except (ChainTimeoutError, NonceTakenError, TransactionRefusedError):
            with self._lock:  # the next send asks the node which nonce is next
                self._nonces.pop(sender, None)
            raise
        if receipt["status"] != 1:
            raise TransactionRevertedError(
                f"transaction {receipt['transactionHash'].to_0x_hex()} reverted (gas limit {gas})"
            )
        return receipt

    def fees(self, *, refresh: bool = False) -> tuple[int, int]:
        """Return (maxFeePerGas, maxPriorityFeePerGas), cached until a refresh is asked.

        The tip is the median of recent blocks' 50th-percentile rewards (the node's
        eth_maxPriorityFeePerGas without any); the cap leaves room for the base fee to double,
        never above the policy's ``max_fee_wei`` (:mod:`contracts.tx_policy`).
        """
        if self._fees is None or refresh:
            block = self._request("reading the base fee", self.w3.eth.get_block, "pending")
            base_fee = int(block.get("baseFeePerGas", 0))
            self._fees = self.policy.fees(base_fee, self._tip())
        return self._fees

    def _tip(self) -> int:
        """The median recent 50th-percentile tip, or the node's suggestion without one."""
        try:
            history = self._request(
                "reading the fee history",
                self.w3.eth.fee_history,
                FEE_HISTORY_BLOCKS,
                "pending",
                [50],
            )
            tip = tip_from_history(list(history.get("reward") or []))
        except ChainError:
            tip = None
        if tip:
            return tip
        return int(self._request("reading the priority fee", lambda: self.w3.eth.max_priority_fee))

    def _send_raw(self, key: str, sender: str, tx: dict[str, Any]) -> Sent:
        """Sign and send; once, refresh the fees or the nonce if the chain says they are stale."""
        refresh_fees = False
        for attempt in (0, 1):
            # The node's next nonce, unless this transactor has sent above it (a transaction of
            # its own dropped, then sent again by its wait): never the nonce of a transaction
            # the node holds that this transactor did not make (another transactor or process
            # of the key), which fees higher than its own would silently replace.
            nonce = int(
                self._request(
                    "reading the nonce", self.w3.eth.get_transaction_count, sender, "pending"
                )
            )
            nonce = max(nonce, self._nonces.get(sender, nonce))
            max_fee, tip = self.fees(refresh=refresh_fees)
            tx.update(nonce=nonce, maxFeePerGas=max_fee, maxPriorityFeePerGas=tip)
            signed = Account.sign_transaction(tx, key)
            try:
                tx_hash = self._request(
                    "sending the transaction",
                    self.w3.eth.send_raw_transaction,
                    signed.raw_transaction,
                )
            except EscrowError as error:
                self._nonces.pop(sender, None)
                known = self._sent_before(signed.hash)
                if known:  # an earlier try of these very bytes got through
                    self._nonces[sender] = nonce + 1
                    return self._pending.record(sender, tx, signed.hash, signed.raw_transaction)
                if attempt == 0 and isinstance(error, FeeTooLowError):
                    refresh_fees = True
                    continue
                if attempt == 0 and isinstance(error, NonceTooLowError) and known is False:
                    continue  # another sender of this key took the nonce: a fresh one
                raise
            self._nonces[sender] = nonce + 1
            return self._pending.record(sender, tx, tx_hash, signed.raw_transaction)
        raise AssertionError("unreachable")

    def _sent_before(self, tx_hash: Any) -> bool | None:
        """Return whether the node knows the signed transaction `tx_hash` (pending or mined);
        None when it cannot be asked.

        A send can reach the node and its answer still fail (a stale or lost reply; the same
        bytes asked again then get "already imported", or "nonce too low" once mined). Before
        a refused send is signed again with a fresh nonce, this says whether it was in fact
        sent: the one intended transaction is never sent twice. If the node cannot say, the
        send's own error stands (raised, never retried with a fresh nonce).
        """

        def lookup() -> bool:
            try:
                self.w3.eth.get_transaction(tx_hash)
            except TransactionNotFound:
                return False
            return True

        try:
            return bool(self._request("looking up a sent transaction", lookup))
        except ChainError:
            return None

    @staticmethod
    def refused_by_node(error: ChainError) -> bool:
        """Return whether `error` is the node's own refusal of a transaction (an answer with a
        rejection code), not a failure to reach or hear it."""
        cause = error.__cause__
        return isinstance(cause, Web3RPCError) and rpc_error(cause)[0] in TX_REJECTED_CODES

    def _receipt_or_none(self, tx_hash: Any) -> Any:
        try:
            return self.w3.eth.get_transaction_receipt(tx_hash)
        except (TransactionNotFound, TransactionIndexingInProgress):
            return None

    def address_of(self, key: str) -> str:
        """Return the address of a private key (cached)."""
        address = self._addresses.get(key)
        if address is None:
            address = self._addresses[key] = Account.from_key(key).address
        return address

    @property
    def replaced(self) -> int:
        """Versions signed again with higher fees because the last was not mined in time."""
        return self._pending.replaced

    @property
    def resent(self) -> int:
        """Transactions sent again after the node forgot them (dropped, reorged, a nonce gap)."""
        return self._pending.resent

    @property
    def filled(self) -> int:
        """Nonces below a waiting transaction that no one held, filled with a transfer of
        nothing to the sender so that it runs."""
        return self._pending.filled

    def reset_nonces(self) -> None:
        """Forget tracked nonces (after a chain snapshot revert)."""
        with self._lock:
            self._nonces.clear()

    def call(self, fn: Any, block: BlockIdentifier = "latest") -> Any:
        """Run a view call at `block`, raising the typed revert on failure."""
        return self._request("calling", fn.call, block_identifier=block)

    def revert_of(self, exc: Exception) -> EscrowError:
        """Return the typed revert carried by `exc`, or its classified chain error."""
        data = getattr(exc, "data", None)
        typed = self._decoder.decode(data if isinstance(data, str | bytes) else None)
        return typed if typed is not None else classify(exc)

    def _request(self, what: str, method: Any, *args: Any, **kwargs: Any) -> Any:
        """Make one request to the node; ask again while it answers for a block it does not
        have (at most `STALE_BLOCK_RETRIES` times, backing off), and raise what fails typed."""
        for attempt in range(STALE_BLOCK_RETRIES + 1):
            try:
                return method(*args, **kwargs)
            except _FAILURES as exc:
                if not stale_block(exc):
                    raise self.revert_of(exc) from exc
                if attempt < STALE_BLOCK_RETRIES:
                    time.sleep(STALE_BLOCK_BACKOFF_S * (attempt + 1))
                    continue
                raise StaleBlockError(
                    f"{what}: the node answered {attempt + 1} times for a block it does not "
                    f"have: {rpc_error(exc)[1]}"
                ) from exc
        raise AssertionError("unreachable")
