"""The escrow's signed messages as frozen dataclasses, and the values they carry.

Each class is one struct of `contracts/typed_data.json` (mirrored field for field by
`contracts/sol/types/Messages.sol`); `contracts.eip712` derives its encoding from that file.
Digests are tested to equal both the contract's digest views and eth-account's typed-data
encoder. Keys, signing and recovery live in `contracts.signing`; the names this module has
always offered from there are re-exported.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from contracts.eip712 import Domain, Message, check, definition, verify
from contracts.signing import (
    SECP256K1_N,
    address_of,
    checksum_of,
    recover_digest,
    recover_public,
    sign_digest,
)

__all__ = [
    "DOMAIN_NAME",
    "DOMAIN_VERSION",
    "KIND_COMPILE",
    "KIND_INFERENCE",
    "SECP256K1_N",
    "STATUS_SUCCESS",
    "ZERO_ADDRESS",
    "ZERO_HASH",
    "Ack",
    "Claim",
    "Domain",
    "Plan",
    "Quote",
    "Receipt",
    "TaskRequest",
    "Voucher",
    "address_of",
    "checksum_of",
    "recover_digest",
    "recover_public",
    "sign_digest",
    "task_bitmap",
    "verify",
]

KIND_COMPILE = 0
KIND_INFERENCE = 1
STATUS_SUCCESS = 0
DOMAIN_NAME = str(definition()["domain"]["name"])
DOMAIN_VERSION = str(definition()["domain"]["version"])
ZERO_ADDRESS = "0x" + "00" * 20
ZERO_HASH = b"\x00" * 32


@dataclass(frozen=True)
class Plan(Message):
    """How a deal prices each task (see `contracts.pricing`)."""

    TYPE_NAME: ClassVar[str] = "Plan"

    price_per_device_ms: int = 0
    compile_price: int = 0
    inference_price: int = 0
    reservation_fee: int = 0
    reserved_discount_bps: int = 0
    cache_hit_discount_bps: int = 0
    tier1_from_task: int = 0
    tier1_discount_bps: int = 0
    tier2_from_task: int = 0
    tier2_discount_bps: int = 0
    outcome_based: bool = False


@dataclass(frozen=True)
class Quote(Message):
    """Terms a provider signs; a client opens a deal with it."""

    TYPE_NAME: ClassVar[str] = "Quote"

    provider: str
    client: str
    arbiter: str
    max_spend: int
    stake: int
    penalty: int
    duration: int
    challenge_window: int
    slo_ms: int
    valid_until: int
    nonce: int
    plan: Plan


@dataclass(frozen=True)
class TaskRequest(Message):
    """A client's signed request to run one task of a deal."""

    TYPE_NAME: ClassVar[str] = "TaskRequest"

    deal_id: int
    task_index: int
    kind: int
    program_hash: bytes
    input_hash: bytes
    max_price: int
    deadline: int  # unix seconds by which the result must be delivered; the client sets it


@dataclass(frozen=True)
class Ack(Message):
    """A provider's signed acceptance of a task request: its deadline, at this price.

    `request_hash` is the request's EIP-712 struct hash; the deadline it commits to is the
    request's own (`TaskRequest.deadline`), which the client signed.
    """

    TYPE_NAME: ClassVar[str] = "Ack"

    deal_id: int
    task_index: int
    request_hash: bytes
    price: int


@dataclass(frozen=True)
class Receipt(Message):
    """A provider's signed account of one executed task."""

    TYPE_NAME: ClassVar[str] = "Receipt"

    deal_id: int
    task_index: int
    kind: int
    status: int
    cache_hit: bool
    device_ms: int
    compile_ms: int
    program_hash: bytes
    input_hash: bytes
    output_hash: bytes
    started_at: int
    finished_at: int
    deadline: int  # the request's deadline
    amount: int
    prev_receipt_hash: bytes

    def request(self, max_price: int) -> TaskRequest:
        """Return the task request this receipt answers, given the request's `max_price`."""
        return TaskRequest(
            deal_id=self.deal_id,
            task_index=self.task_index,
            kind=self.kind,
            program_hash=self.program_hash,
            input_hash=self.input_hash,
            max_price=max_price,
            deadline=self.deadline,
        )


@dataclass(frozen=True)
class Voucher(Message):
    """A client's signed cumulative promise to pay: total owed and the tasks it covers."""

    TYPE_NAME: ClassVar[str] = "Voucher"

    deal_id: int
    cumulative_amount: int
    tasks: tuple[int, ...]

    def covers(self, task_index: int) -> bool:
        """Return whether the voucher pays task `task_index`."""
        word, bit = divmod(task_index, 256)
        return word < len(self.tasks) and bool(self.tasks[word] >> bit & 1)


@dataclass(frozen=True)
class Claim:
    """One task a provider claims on chain: its receipt and the client's signed request.

    The request is rebuilt from the receipt's fields and `max_price`, so the client's
    signature binds the task, its hashes, its deadline and the most it pays.
    """

    receipt: Receipt
    max_price: int
    request_signature: bytes

    def as_args(self) -> tuple[Any, ...]:
        """Return the claim as a tuple for a contract call."""
        return (self.receipt.as_args(), self.max_price, self.request_signature)


def task_bitmap(task_indices: Any) -> tuple[int, ...]:
    """Return the voucher bitmap words that mark every index in `task_indices`."""
    indices = sorted(set(task_indices))
    if not indices:
        return ()
    words = [0] * (indices[-1] // 256 + 1)
    for index in indices:
        if index < 0:
            raise ValueError("task indices are non-negative")
        words[index // 256] |= 1 << (index % 256)
    return tuple(words)


for _message in (Plan, Quote, TaskRequest, Ack, Receipt, Voucher):
    check(_message)  # a class that drifts from typed_data.json fails here, at import
