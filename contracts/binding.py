"""Typed Python binding of ComputeEscrow and SettlementToken over web3.

One method per contract function; transactions are estimated first (so a revert surfaces as a
typed exception named after the contract's custom error), signed locally and sent raw with
locally tracked nonces; receipts come back with their events decoded.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

from eth_abi.abi import decode as abi_decode
from eth_abi.abi import encode as abi_encode
from eth_account import Account
from eth_utils.abi import function_abi_to_4byte_selector
from eth_utils.address import to_checksum_address
from web3 import Web3
from web3.contract import Contract
from web3.exceptions import ContractCustomError, ContractLogicError, Web3RPCError

from contracts.chain import rpc_batch
from contracts.compiler import Artifact, load_contracts
from contracts.errors import ChainError, ContractRevert
from contracts.messages import Ack, Claim, Domain, Plan, Quote, Receipt, TaskRequest, Voucher
from contracts.reverts import REVERTS

GAS_MARGIN = 1.2
# Deployment defaults: a minute is the least a provider's daemon gets after each deadline to
# settle its tasks; disputes give the arbiter a week.
DEFAULT_MIN_CHALLENGE_WINDOW = 60
DEFAULT_ARBITRATION_PERIOD = 7 * 24 * 3600


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


@dataclass(frozen=True)
class DealState:
    """A deal as the escrow stores it."""

    client: str
    provider: str
    arbiter: str
    status: int
    expiry: int
    challenge_window: int
    max_spend: int
    committed: int
    vouched: int
    pending: int
    stake: int
    penalty: int
    plan_hash: bytes
    batch_count: int
    client_agreed_close: bool
    provider_agreed_close: bool

    @property
    def locked(self) -> int:
        """Return the client funds still locked in the deal (pending claims included)."""
        return self.max_spend - self.committed if self.status == DEAL_OPEN else 0


@dataclass(frozen=True)
class BatchState:
    """A claimed batch of receipts as stored."""

    amount: int
    deadline: int
    status: int
    tasks: int


DEAL_NONE, DEAL_OPEN, DEAL_CLOSED = 0, 1, 2
BATCH_NONE, BATCH_PENDING, BATCH_DISPUTED, BATCH_PAID, BATCH_REJECTED = 0, 1, 2, 3, 4
TASK_NONE, TASK_VOUCHED, TASK_CLAIMED, TASK_REFUNDED = 0, 1, 2, 3


class _ErrorDecoder:
    """Turn revert data into the typed exception named after the custom error."""

    def __init__(self, abis: list[list[dict[str, Any]]]) -> None:
        self._by_selector: dict[bytes, tuple[str, list[str], list[str]]] = {}
        for abi in abis:
            for item in abi:
                if item["type"] == "error":
                    selector = _selector(item)
                    types = [i["type"] for i in item["inputs"]]
                    names = [i["name"] for i in item["inputs"]]
                    self._by_selector[selector] = (item["name"], types, names)

    def decode(self, data: str | bytes | None) -> ContractRevert | None:
        if data is None:
            return None
        raw = bytes.fromhex(data.removeprefix("0x")) if isinstance(data, str) else data
        entry = self._by_selector.get(raw[:4])
        if entry is None:
            return None
        name, types, names = entry
        values = abi_decode(types, raw[4:])
        args = {n: _plain(t, v) for n, t, v in zip(names, types, values, strict=True)}
        return REVERTS.get(name, ContractRevert)(name, args)


def _selector(item: dict[str, Any]) -> bytes:
    return bytes(function_abi_to_4byte_selector(item))  # type: ignore[arg-type]


def _plain(kind: str, value: Any) -> Any:
    if kind == "address":
        return to_checksum_address(value)
    if isinstance(value, bytes):
        return "0x" + value.hex()
    return value


class Transactor:
    """Sign and send transactions for local keys, tracking nonces per sender."""

    def __init__(self, w3: Web3, decoder: _ErrorDecoder) -> None:
        self.w3 = w3
        self._decoder = decoder
        self._nonces: dict[str, int] = {}
        self._lock = threading.Lock()
        self._addresses: dict[str, str] = {}
        self._max_fee: int | None = None
        self.chain_id = w3.eth.chain_id

    def send(self, key: str, to: str | None, data: bytes | str, gas: int | None = None) -> Any:
        """Send a transaction, wait for its receipt and return it; raise the typed revert."""
        sender = self._address(key)
        tx: dict[str, Any] = {"from": sender, "data": data, "value": 0}
        if to is not None:
            tx["to"] = to
        with self._lock:
            if gas is None:
                gas = int(self._call(self.w3.eth.estimate_gas, tx, "pending") * GAS_MARGIN)
            nonce = self._nonces.get(sender)
            if nonce is None:
                nonce = self.w3.eth.get_transaction_count(sender, "pending")  # type: ignore[arg-type]
            del tx["from"]
            tx.update(gas=gas, nonce=nonce, chainId=self.chain_id, maxPriorityFeePerGas=0)
            tx_hash = self._send_raw(key, tx)
            self._nonces[sender] = nonce + 1
        receipt = self.w3.eth.wait_for_transaction_receipt(tx_hash, timeout=60, poll_latency=0.01)
        if receipt["status"] != 1:
            raise ChainError(f"transaction {tx_hash.to_0x_hex()} reverted (gas limit {gas})")
        return receipt

    def _send_raw(self, key: str, tx: dict[str, Any]) -> Any:
        """Sign and send with a cached fee cap, refreshing it once if the chain wants more."""
        for attempt in (0, 1):
            if self._max_fee is None or attempt:
                base_fee = int(self.w3.eth.get_block("pending").get("baseFeePerGas", 0))
                self._max_fee = base_fee * 2 + 10**9
            tx["maxFeePerGas"] = self._max_fee
            signed = Account.sign_transaction(tx, key)
            try:
                return self.w3.eth.send_raw_transaction(signed.raw_transaction)
            except Web3RPCError as exc:
                if attempt or "fee" not in str(exc).lower():
                    self._nonces.pop(self._address(key), None)
                    raise ChainError(f"transaction rejected: {exc}") from exc
        raise AssertionError("unreachable")

    def _address(self, key: str) -> str:
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

    def _call(self, method: Any, *args: Any) -> Any:
        try:
            return method(*args)
        except (ContractCustomError, ContractLogicError, Web3RPCError) as exc:
            data = getattr(exc, "data", None)
            typed = self._decoder.decode(data if isinstance(data, str | bytes) else None)
            if typed is not None:
                raise typed from exc
            raise ChainError(str(exc)) from exc


class _Bound:
    """A deployed contract with a transactor and an event decoder."""

    def __init__(self, transactor: Transactor, address: str, abi: list[dict[str, Any]]) -> None:
        self.tx = transactor
        self.address = to_checksum_address(address)
        self.contract: Contract = transactor.w3.eth.contract(address=self.address, abi=abi)
        self._inputs = {
            item["name"]: (
                _selector(item),
                [_abi_type(i) for i in item["inputs"]],
            )
            for item in abi
            if item["type"] == "function"
        }
        self._outputs = {
            item["name"]: [_abi_type(o) for o in item["outputs"]]
            for item in abi
            if item["type"] == "function"
        }
        self._events = {
            bytes(transactor.w3.keccak(text=_event_signature(item))): item["name"]
            for item in abi
            if item["type"] == "event"
        }

    def _send(self, key: str, name: str, *args: Any, gas: int | None = None) -> TxResult:
        data = self.contract.encode_abi(name, args=list(args))
        receipt = self.tx.send(key, self.address, data, gas=gas)
        return TxResult(
            tx_hash=receipt["transactionHash"].to_0x_hex(),
            gas_used=receipt["gasUsed"],
            block_number=receipt["blockNumber"],
            events=self.decode_events(receipt["logs"]),
        )

    def _view(self, name: str, *args: Any) -> Any:
        return self.tx.call(self.contract.functions[name](*args))

    def _encode_call(self, name: str, args: tuple[Any, ...]) -> str:
        selector, types = self._inputs[name]
        return "0x" + (selector + abi_encode(types, list(args))).hex()

    def read_many(self, calls: list[tuple[str, tuple[Any, ...]]]) -> list[Any]:
        """Run several view calls in one JSON-RPC batch; return decoded results in order."""
        url = self.tx.w3.provider.endpoint_uri  # type: ignore[attr-defined]
        payload = [
            ("eth_call", [{"to": self.address, "data": self._encode_call(n, a)}, "latest"])
            for n, a in calls
        ]
        results = []
        for (name, _), raw in zip(calls, rpc_batch(url, payload), strict=True):
            outputs = self._outputs[name]
            values = abi_decode(outputs, bytes.fromhex(raw.removeprefix("0x")))
            results.append(values[0] if len(values) == 1 else values)
        return results

    def decode_events(self, logs: Any) -> tuple[Event, ...]:
        """Decode this contract's events among `logs`."""
        events = []
        for log in logs:
            if to_checksum_address(log["address"]) != self.address or not log["topics"]:
                continue
            name = self._events.get(bytes(log["topics"][0]))
            if name is None:
                continue
            decoded = self.contract.events[name]().process_log(log)
            events.append(Event(name=name, args=dict(decoded["args"])))
        return tuple(events)


def _event_signature(item: dict[str, Any]) -> str:
    return f"{item['name']}({','.join(_abi_type(i) for i in item['inputs'])})"


def _abi_type(item: dict[str, Any]) -> str:
    kind = str(item["type"])
    if kind.startswith("tuple"):
        return "(" + ",".join(_abi_type(c) for c in item["components"]) + ")" + kind[5:]
    return kind


class Token(_Bound):
    """The ERC-20 settlement token."""

    def balance_of(self, account: str) -> int:
        """Return the token balance of `account`."""
        return int(self._view("balanceOf", to_checksum_address(account)))

    def total_supply(self) -> int:
        """Return the total supply."""
        return int(self._view("totalSupply"))

    def decimals(self) -> int:
        """Return the token's decimals."""
        return int(self._view("decimals"))

    def mint(self, key: str, to: str, amount: int) -> TxResult:
        """Mint `amount` to `to` (deployer only)."""
        return self._send(key, "mint", to_checksum_address(to), amount)

    def approve(self, key: str, spender: str, amount: int) -> TxResult:
        """Allow `spender` to move `amount` of the signer's tokens."""
        return self._send(key, "approve", to_checksum_address(spender), amount)

    def transfer(self, key: str, to: str, amount: int) -> TxResult:
        """Transfer `amount` to `to`."""
        return self._send(key, "transfer", to_checksum_address(to), amount)

    def allowance(self, owner: str, spender: str) -> int:
        """Return what `spender` may move of `owner`'s tokens."""
        return int(
            self._view("allowance", to_checksum_address(owner), to_checksum_address(spender))
        )


class Escrow(_Bound):
    """The ComputeEscrow contract: one method per contract function."""

    @property
    def domain(self) -> Domain:
        """Return the EIP-712 domain of this escrow."""
        return Domain(chain_id=self.tx.chain_id, verifying_contract=self.address)

    # transactions
    def deposit(self, key: str, amount: int) -> TxResult:
        """Move tokens from the signer into its free balance (approve first)."""
        return self._send(key, "deposit", amount)

    def withdraw(self, key: str, amount: int) -> TxResult:
        """Move tokens from the signer's free balance back to the signer."""
        return self._send(key, "withdraw", amount)

    def stake(self, key: str, amount: int) -> TxResult:
        """Move tokens from the signer into its free provider stake (approve first)."""
        return self._send(key, "stake", amount)

    def unstake(self, key: str, amount: int) -> TxResult:
        """Move free stake back to the signer."""
        return self._send(key, "unstake", amount)

    def cancel_quote_nonce(self, key: str, nonce: int) -> TxResult:
        """Make one of the signer's quote nonces unusable."""
        return self._send(key, "cancelQuoteNonce", nonce)

    def open_deal(self, key: str, quote: Quote, signature: bytes, max_spend: int) -> TxResult:
        """Open a deal with a provider-signed quote; the event `DealOpened` has the id."""
        return self._send(key, "openDeal", quote.as_args(), signature, max_spend)

    def redeem_voucher(
        self, key: str, voucher: Voucher, signature: bytes, gas: int | None = None
    ) -> TxResult:
        """Pay the provider the increase of a client-signed cumulative voucher (provider only)."""
        return self._send(key, "redeemVoucher", voucher.as_args(), signature, gas=gas)

    def claim_receipts(
        self,
        key: str,
        deal_id: int,
        plan: Plan,
        claims: list[Claim],
        gas: int | None = None,
    ) -> TxResult:
        """Claim unvouched tasks, each with its receipt and the client's signed request."""
        return self._send(
            key, "claimReceipts", deal_id, plan.as_args(), [c.as_args() for c in claims], gas=gas
        )

    def finalize_claim(self, key: str, deal_id: int, batch_id: int) -> TxResult:
        """Pay an undisputed batch after its challenge window."""
        return self._send(key, "finalizeClaim", deal_id, batch_id)

    def dispute_claim(self, key: str, deal_id: int, batch_id: int) -> TxResult:
        """Dispute a pending batch (client only)."""
        return self._send(key, "disputeClaim", deal_id, batch_id)

    def resolve_dispute(
        self, key: str, deal_id: int, batch_id: int, provider_wins: bool
    ) -> TxResult:
        """Rule on a disputed batch (arbiter only)."""
        return self._send(key, "resolveDispute", deal_id, batch_id, provider_wins)

    def lapse_dispute(self, key: str, deal_id: int, batch_id: int) -> TxResult:
        """End a dispute left unresolved past the arbitration period, for the client."""
        return self._send(key, "lapseDispute", deal_id, batch_id)

    def refund_breach(
        self, key: str, request: TaskRequest, ack: Ack, ack_signature: bytes
    ) -> TxResult:
        """Refund a breached task with the penalty (client only, after its settlement instant)."""
        return self._send(key, "refundBreach", request.as_args(), ack.as_args(), ack_signature)

    def close_deal(self, key: str, deal_id: int) -> TxResult:
        """Close a deal (alone after expiry plus two windows, early once both parties call)."""
        return self._send(key, "closeDeal", deal_id)

    # views
    def token(self) -> str:
        """Return the settlement token's address."""
        return to_checksum_address(self._view("token"))

    def balance_of(self, account: str) -> int:
        """Return the free balance of `account`."""
        return int(self._view("balanceOf", to_checksum_address(account)))

    def stake_of(self, provider: str) -> int:
        """Return the free stake of `provider`."""
        return int(self._view("stakeOf", to_checksum_address(provider)))

    def is_nonce_used(self, provider: str, nonce: int) -> bool:
        """Return whether a provider's quote nonce is used or cancelled."""
        return bool(self._view("isNonceUsed", to_checksum_address(provider), nonce))

    def get_deal(self, deal_id: int) -> DealState:
        """Return a deal as stored."""
        raw = self._view("getDeal", deal_id)
        values = list(raw.values()) if isinstance(raw, dict) else list(raw)
        values[0:3] = [to_checksum_address(v) for v in values[0:3]]
        return DealState(*values)

    def get_batch(self, deal_id: int, batch_id: int) -> BatchState:
        """Return a claimed batch as stored."""
        raw = self._view("getBatch", deal_id, batch_id)
        values = list(raw.values()) if isinstance(raw, dict) else list(raw)
        return BatchState(*values)

    def task_status(self, deal_id: int, task_index: int) -> int:
        """Return the settlement state of a task (TASK_* constants)."""
        return int(self._view("taskStatus", deal_id, task_index))

    def min_challenge_window(self) -> int:
        """Return the shortest challenge window a quote may set on this escrow."""
        return int(self._view("minChallengeWindow"))

    def arbitration_period(self) -> int:
        """Return how long an arbiter has to rule before a dispute lapses for the client."""
        return int(self._view("arbitrationPeriod"))

    def deal_count(self) -> int:
        """Return the number of deals opened so far."""
        return int(self._view("dealCount"))

    def price(
        self,
        plan: Plan,
        *,
        kind: int,
        status: int,
        cache_hit: bool,
        device_ms: int,
        task_index: int,
    ) -> int:
        """Return the contract's price for one task's usage."""
        return int(
            self._view("price", plan.as_args(), kind, status, cache_hit, device_ms, task_index)
        )

    def digest(self, message: Quote | TaskRequest | Ack | Receipt | Voucher) -> bytes:
        """Return the contract's EIP-712 digest of a message."""
        view = {
            Quote: "quoteDigest",
            TaskRequest: "taskRequestDigest",
            Ack: "ackDigest",
            Receipt: "receiptDigest",
            Voucher: "voucherDigest",
        }[type(message)]
        return bytes(self._view(view, message.as_args()))

    def plan_hash(self, plan: Plan) -> bytes:
        """Return the contract's struct hash of a plan."""
        return bytes(self._view("planHash", plan.as_args()))


@dataclass(frozen=True)
class Deployment:
    """Addresses of a deployed token and escrow, and their deploy gas."""

    token: str
    escrow: str
    token_gas: int
    escrow_gas: int


def decoder(artifacts: dict[str, Artifact]) -> _ErrorDecoder:
    """Return the revert decoder for the compiled contracts."""
    return _ErrorDecoder([a.abi for a in artifacts.values()])


def connect(rpc_url: str) -> Web3:
    """Return a Web3 connected to `rpc_url`; raise ChainError if it does not answer."""
    w3 = Web3(Web3.HTTPProvider(rpc_url, request_kwargs={"timeout": 30}))
    if not w3.is_connected():
        raise ChainError(f"no JSON-RPC endpoint answers at {rpc_url}")
    return w3


class Chain:
    """A connection to a chain with the compiled contracts: deploy or bind them."""

    def __init__(self, rpc_url: str, artifacts: dict[str, Artifact] | None = None) -> None:
        self.rpc_url = rpc_url
        self.w3 = connect(rpc_url)
        self.artifacts = artifacts or load_contracts()
        self.tx = Transactor(self.w3, decoder(self.artifacts))

    def deploy(
        self,
        key: str,
        *,
        min_challenge_window: int = DEFAULT_MIN_CHALLENGE_WINDOW,
        arbitration_period: int = DEFAULT_ARBITRATION_PERIOD,
    ) -> Deployment:
        """Deploy the settlement token and the escrow, signed by `key`.

        `min_challenge_window` is the shortest window a quote may set: the time a provider's
        daemon has after each task's deadline to settle it, restarts included.
        """
        token = self.artifacts["SettlementToken"]
        token_receipt = self.tx.send(key, None, token.bytecode)
        token_address = to_checksum_address(token_receipt["contractAddress"])
        escrow = self.artifacts["ComputeEscrow"]
        ctor = self.w3.eth.contract(abi=escrow.abi, bytecode=escrow.bytecode)
        data = ctor.constructor(
            token_address, min_challenge_window, arbitration_period
        ).data_in_transaction
        escrow_receipt = self.tx.send(key, None, data)
        return Deployment(
            token=token_address,
            escrow=to_checksum_address(escrow_receipt["contractAddress"]),
            token_gas=token_receipt["gasUsed"],
            escrow_gas=escrow_receipt["gasUsed"],
        )

    def escrow(self, address: str) -> Escrow:
        """Bind the escrow at `address`."""
        return Escrow(self.tx, address, self.artifacts["ComputeEscrow"].abi)

    def token(self, address: str) -> Token:
        """Bind the settlement token at `address`."""
        return Token(self.tx, address, self.artifacts["SettlementToken"].abi)
