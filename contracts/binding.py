"""Typed Python binding of ComputeEscrow and SettlementToken over web3.

One method per contract function; transactions are estimated first (so a revert surfaces as a
typed exception named after the contract's custom error), signed locally and sent raw with
locally tracked nonces; receipts come back with their events decoded.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from eth_abi.abi import decode as abi_decode
from eth_abi.abi import encode as abi_encode
from eth_utils.address import to_checksum_address
from web3.contract import Contract
from web3.types import RPCEndpoint

from contracts.abi import abi_type, entries, topic
from contracts.compiler import Artifact, load_contracts
from contracts.eip712 import Domain
from contracts.errors import ChainError
from contracts.messages import Ack, Claim, Plan, Quote, Receipt, TaskRequest, Voucher
from contracts.rpc_endpoints import connect
from contracts.states import (
    BATCH_DISPUTED,
    BATCH_NONE,
    BATCH_PAID,
    BATCH_PENDING,
    BATCH_REJECTED,
    DEAL_CLOSED,
    DEAL_NONE,
    DEAL_OPEN,
    TASK_CLAIMED,
    TASK_NONE,
    TASK_REFUNDED,
    TASK_VOUCHED,
    BatchState,
    BatchStatus,
    DealState,
    DealStatus,
    TaskStatus,
)
from contracts.transactor import ErrorDecoder, Event, Transactor, TxResult, selector_of
from contracts.tx_policy import TxPolicy

__all__ = [
    "BATCH_DISPUTED",
    "BATCH_NONE",
    "BATCH_PAID",
    "BATCH_PENDING",
    "BATCH_REJECTED",
    "DEAL_CLOSED",
    "DEAL_NONE",
    "DEAL_OPEN",
    "TASK_CLAIMED",
    "TASK_NONE",
    "TASK_REFUNDED",
    "TASK_VOUCHED",
    "BatchState",
    "BatchStatus",
    "Chain",
    "DealState",
    "DealStatus",
    "Deployment",
    "Escrow",
    "Event",
    "TaskStatus",
    "Token",
    "Transactor",
    "TxResult",
    "connect",
    "indexed_topic",
]

# Deployment defaults: a minute is the least a provider's daemon gets after each deadline to
# settle its tasks; disputes give the arbiter a week.
DEFAULT_MIN_CHALLENGE_WINDOW = 60
DEFAULT_ARBITRATION_PERIOD = 7 * 24 * 3600


class _Bound:
    """A deployed contract with a transactor and an event decoder."""

    def __init__(self, transactor: Transactor, address: str, abi: list[dict[str, Any]]) -> None:
        self.tx = transactor
        self.address = to_checksum_address(address)
        self.contract: Contract = transactor.w3.eth.contract(address=self.address, abi=abi)
        self._inputs = {
            item["name"]: (
                selector_of(item),
                [abi_type(i) for i in item["inputs"]],
            )
            for item in abi
            if item["type"] == "function"
        }
        self._outputs = {
            item["name"]: [abi_type(o) for o in item["outputs"]]
            for item in abi
            if item["type"] == "function"
        }
        self._topics = {name: topic(item) for name, item in entries([abi], "event").items()}
        self._events = {event_topic: name for name, event_topic in self._topics.items()}

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
        """Run several view calls in one JSON-RPC batch; return decoded results in order.

        The batch goes through the web3 provider's batch request; a call that reverts raises
        its typed revert, like a single view call.
        """
        batch = [
            (
                RPCEndpoint("eth_call"),
                [{"to": self.address, "data": self._encode_call(n, a)}, "latest"],
            )
            for n, a in calls
        ]
        try:
            replies = self.tx.w3.provider.make_batch_request(batch)  # type: ignore[attr-defined]
        except Exception as exc:
            raise self.tx.revert_of(exc) from exc
        if not isinstance(replies, list):  # the node refused the whole batch
            raise self.tx.revert_of(_RpcReplyError(str(replies.get("error")), None))
        # the provider numbers the requests in order; replies may come in any order
        ordered: list[dict[str, Any]] = sorted(replies, key=lambda reply: int(reply["id"]))
        if len(ordered) != len(calls):
            raise ChainError(f"the chain answered {len(ordered)} of {len(calls)} batched calls")
        results = []
        for (name, _), reply in zip(calls, ordered, strict=True):
            error = reply.get("error")
            if error is not None or "result" not in reply:
                data = error.get("data") if isinstance(error, dict) else None
                raise self.tx.revert_of(_RpcReplyError(f"{name}: {error}", data))
            values = abi_decode(
                self._outputs[name], bytes.fromhex(reply["result"].removeprefix("0x"))
            )
            results.append(values[0] if len(values) == 1 else values)
        return results

    def event_topic(self, name: str) -> str:
        """Return the first topic (0x-hex) of this contract's event `name`, from its ABI.

        Raise KeyError if the contract has no such event. Filter logs with it; an indexed
        argument's topic is `indexed_topic(value)`.
        """
        return "0x" + self._topics[name].hex()

    def decode_events(self, logs: Any) -> tuple[Event, ...]:
        """Decode this contract's events among `logs`, each by its ABI entry (found by topic)."""
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


ETH_CALL = RPCEndpoint("eth_call")


def indexed_topic(value: int | str) -> str:
    """Return the topic (0x-hex) of an indexed `uint256` (an int) or `address` (0x-text)."""
    if isinstance(value, int):
        return "0x" + value.to_bytes(32, "big").hex()
    return "0x" + bytes.fromhex(value.removeprefix("0x")).rjust(32, b"\0").hex()


class _RpcReplyError(Exception):
    """One failed reply of a batch, carrying its revert data for the decoder."""

    def __init__(self, message: str, data: Any) -> None:
        super().__init__(message)
        self.data = data


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

    def set_arbiter_fee(self, key: str, fee: int) -> TxResult:
        """Set the fee the key's arbiter charges per ruled dispute (deals opened after take it)."""
        return self._send(key, "setArbiterFee", fee)

    def lapse_dispute(self, key: str, deal_id: int, batch_id: int) -> TxResult:
        """End a dispute left unresolved past the arbitration period, for the client."""
        return self._send(key, "lapseDispute", deal_id, batch_id)

    def refund_breach(
        self, key: str, request: TaskRequest, ack: Ack, ack_signature: bytes
    ) -> TxResult:
        """Refund a breached task with the penalty (client only, after its settlement instant)."""
        return self._send(key, "refundBreach", request.as_args(), ack.as_args(), ack_signature)

    def close_deal(self, key: str, deal_id: int) -> TxResult:
        """Close a deal (alone after expiry plus two windows, early while both agreements are in
        force: each lapses two challenge windows after it is given)."""
        return self._send(key, "closeDeal", deal_id)

    def withdraw_close_agreement(self, key: str, deal_id: int) -> TxResult:
        """Withdraw the signer's early-close agreement (client or provider)."""
        return self._send(key, "withdrawCloseAgreement", deal_id)

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

    def arbiter_fee(self, arbiter: str) -> int:
        """Return the fee `arbiter` charges per ruled dispute of deals opened now."""
        return int(self._view("arbiterFee", to_checksum_address(arbiter)))

    def deal_arbiter_fee(self, deal_id: int) -> tuple[int, int]:
        """Return a deal's arbiter fee and the fees its client holds in open disputes."""
        fee, held = self._view("dealArbiterFee", deal_id)
        return int(fee), int(held)

    def deal_count(self) -> int:
        """Return the number of deals opened so far."""
        return int(self._view("dealCount"))

    def locked_stake(self, quote_stake: int, quote_max_spend: int, max_spend: int) -> int:
        """Return the stake a deal opened for `max_spend` locks under a quote's stake and cap."""
        return int(self._view("lockedStake", quote_stake, quote_max_spend, max_spend))

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


def decoder(artifacts: dict[str, Artifact]) -> ErrorDecoder:
    """Return the revert decoder for the compiled contracts."""
    return ErrorDecoder([a.abi for a in artifacts.values()])


class Chain:
    """A connection to a chain with the compiled contracts: deploy or bind them."""

    def __init__(
        self,
        rpc_url: str,
        artifacts: dict[str, Artifact] | None = None,
        *,
        policy: TxPolicy | None = None,
    ) -> None:
        """Connect to `rpc_url` (one endpoint, or several separated by commas: failover);
        transactions follow `policy` (fees, replacement, confirmations)."""
        self.rpc_url = rpc_url
        self.w3 = connect(rpc_url)
        self.artifacts = artifacts or load_contracts()
        self.tx = Transactor(self.w3, decoder(self.artifacts), policy=policy)

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
