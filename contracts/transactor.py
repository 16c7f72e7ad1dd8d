"""Signing and sending transactions for local keys, with chain errors sorted into types.

Every transaction is estimated first (so a revert surfaces as the typed exception named after
the contract's custom error), signed locally with EIP-1559 fees (a real priority fee: the
chain's suggestion, and a cap of twice the base fee above it) and sent raw with nonces tracked
per sender. What the node answers is classified once, here: a fee below the base fee, a nonce
already used, a revert, a timeout — each its own `ChainError` subclass, so callers and retries
act on types, not on the text of a message.
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
from web3.exceptions import ContractCustomError, ContractLogicError, TimeExhausted, Web3RPCError

from contracts.errors import (
    ChainError,
    ChainTimeoutError,
    ContractRevert,
    EscrowError,
    FeeTooLowError,
    NonceTooLowError,
    TransactionRevertedError,
)
from contracts.reverts import REVERTS

GAS_MARGIN = 1.2
RECEIPT_TIMEOUT_S = 60.0
"""How long a sent transaction may take to be mined before `ChainTimeoutError`."""


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


def classify(exc: Exception) -> ChainError:
    """Return the typed chain error for what a node or the transport raised."""
    if isinstance(exc, ChainError):
        return exc
    if isinstance(exc, TimeExhausted | requests.Timeout | TimeoutError):
        return ChainTimeoutError(f"the chain did not answer in time: {exc}")
    message = str(exc).lower()
    if isinstance(exc, Web3RPCError):
        # JSON-RPC gives one generic code (-32000/-32003) to every rejection: the node's
        # message is the only discriminant it offers, so it is read in this one place.
        if "base fee" in message or "fee cap" in message or "underpriced" in message:
            return FeeTooLowError(f"fee below what the chain accepts: {exc}")
        if "nonce too low" in message or "nonce has already been used" in message:
            return NonceTooLowError(f"nonce already used: {exc}")
    if isinstance(exc, requests.ConnectionError | ConnectionError):
        return ChainError(f"the chain cannot be reached: {exc}")
    return ChainError(str(exc))


STALE_BLOCK_RETRIES = 3
"""Times a read is asked again when the node answers for a block it has just moved past."""


def stale_block(exc: Exception) -> bool:
    """Return whether the node refused a read because the block it resolved ("latest",
    "pending") was replaced while it answered: a race of the development node under load
    (``BlockOutOfRangeError: block height is N but requested was M``), worth asking again."""
    return "block height is" in str(exc).lower()


class Transactor:
    """Sign and send transactions for local keys, tracking nonces per sender."""

    def __init__(self, w3: Web3, decoder: ErrorDecoder) -> None:
        self.w3 = w3
        self._decoder = decoder
        self._nonces: dict[str, int] = {}
        self._lock = threading.Lock()
        self._addresses: dict[str, str] = {}
        self._fees: tuple[int, int] | None = None
        self.chain_id = w3.eth.chain_id

    def send(self, key: str, to: str | None, data: bytes | str, gas: int | None = None) -> Any:
        """Send a transaction, wait for its receipt and return it; raise the typed error."""
        sender = self.address_of(key)
        tx: dict[str, Any] = {"from": sender, "data": data, "value": 0}
        if to is not None:
            tx["to"] = to
        with self._lock:
            if gas is None:
                gas = int(self._call(self.w3.eth.estimate_gas, tx, "pending") * GAS_MARGIN)
            del tx["from"]
            tx.update(gas=gas, chainId=self.chain_id)
            tx_hash = self._send_raw(key, sender, tx)
        try:
            receipt = self.w3.eth.wait_for_transaction_receipt(
                tx_hash, timeout=RECEIPT_TIMEOUT_S, poll_latency=0.01
            )
        except Exception as exc:
            raise classify(exc) from exc
        if receipt["status"] != 1:
            raise TransactionRevertedError(
                f"transaction {tx_hash.to_0x_hex()} reverted (gas limit {gas})"
            )
        return receipt

    def fees(self, *, refresh: bool = False) -> tuple[int, int]:
        """Return (maxFeePerGas, maxPriorityFeePerGas), cached until a refresh is asked.

        The tip is the node's suggestion; the cap leaves room for the base fee to double.
        """
        if self._fees is None or refresh:
            try:
                base_fee = int(self.w3.eth.get_block("pending").get("baseFeePerGas", 0))
                tip = int(self.w3.eth.max_priority_fee)
            except Exception as exc:
                raise classify(exc) from exc
            self._fees = (base_fee * 2 + tip, tip)
        return self._fees

    def _send_raw(self, key: str, sender: str, tx: dict[str, Any]) -> Any:
        """Sign and send; once, refresh the fees or the nonce if the chain says they are stale."""
        refresh_fees = False
        for attempt in (0, 1):
            nonce = self._nonces.get(sender)
            if nonce is None:
                nonce = self.w3.eth.get_transaction_count(sender, "pending")  # type: ignore[arg-type]
            max_fee, tip = self.fees(refresh=refresh_fees)
            tx.update(nonce=nonce, maxFeePerGas=max_fee, maxPriorityFeePerGas=tip)
            signed = Account.sign_transaction(tx, key)
            try:
                tx_hash = self.w3.eth.send_raw_transaction(signed.raw_transaction)
            except Exception as exc:
                error = classify(exc)
                self._nonces.pop(sender, None)
                if attempt == 0 and isinstance(error, FeeTooLowError):
                    refresh_fees = True
                    continue
                if attempt == 0 and isinstance(error, NonceTooLowError):
                    continue
                raise error from exc
            self._nonces[sender] = nonce + 1
            return tx_hash
        raise AssertionError("unreachable")

    def address_of(self, key: str) -> str:
        """Return the address of a private key (cached)."""
        address = self._addresses.get(key)
        if address is None:
            address = self._addresses[key] = Account.from_key(key).address
        return address

    def reset_nonces(self) -> None:
        """Forget tracked nonces (after a chain snapshot revert)."""
        with self._lock:
            self._nonces.clear()

    def call(self, fn: Any) -> Any:
        """Run a view call, raising the typed revert on failure."""
        return self._call(fn.call)

    def revert_of(self, exc: Exception) -> EscrowError:
        """Return the typed revert carried by `exc`, or its classified chain error."""
        data = getattr(exc, "data", None)
        typed = self._decoder.decode(data if isinstance(data, str | bytes) else None)
        return typed if typed is not None else classify(exc)

    def _call(self, method: Any, *args: Any) -> Any:
        for attempt in range(STALE_BLOCK_RETRIES + 1):
            try:
                return method(*args)
            except (ContractCustomError, ContractLogicError, Web3RPCError) as exc:
                if attempt < STALE_BLOCK_RETRIES and stale_block(exc):
                    time.sleep(0.05 * (attempt + 1))
                    continue
                raise self.revert_of(exc) from exc
            except (requests.RequestException, TimeExhausted, OSError) as exc:
                raise classify(exc) from exc
        raise AssertionError("unreachable")
