"""What a deal's ledger records: a task's state (the client's and the chain's), its record, a run
and a claimed batch, each with its JSON form."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from contracts.messages import Ack, Receipt, TaskRequest


class TaskState(StrEnum):
    """Where a task stands from the client's side (its on-chain state is kept apart)."""

    SENT = "sent"  # signed and stored; the provider may or may not have acked it
    ACKED = "acked"  # the provider acked it; its delivery is awaited
    VERIFIED = "verified"  # delivered by its deadline and verified: payable
    REJECTED = "rejected"  # delivered, but failed verification (late, wrong bytes): not paid
    UNDELIVERED = "undelivered"  # no delivery by its deadline (plus a grace): not paid
    REFUSED = "refused"  # the provider did not accept it: nothing is owed either way


OPEN_STATES = frozenset({TaskState.SENT, TaskState.ACKED})
"""States whose outcome is not known yet: a rerun resumes them."""

BREACHED_STATES = frozenset({TaskState.ACKED, TaskState.REJECTED, TaskState.UNDELIVERED})
"""States of acked tasks not verified: refundable after their settlement instant."""


class ChainState(StrEnum):
    """How a task settled on chain (the escrow's ``taskStatus``)."""

    VOUCHED = "vouched"
    CLAIMED = "claimed"
    REFUNDED = "refunded"


@dataclass(frozen=True)
class TaskRecord:
    """Everything the client knows about one task of the deal."""

    index: int
    run: int
    label: str
    request: TaskRequest
    request_signature: bytes
    target: str | None = None
    state: TaskState = TaskState.SENT
    ack: Ack | None = None
    ack_signature: bytes = b""
    receipt: Receipt | None = None
    receipt_signature: bytes = b""
    outputs: str | None = None  # file name in the ledger's results folder
    result_state: str | None = None  # the provider's word: succeeded or failed
    report: dict[str, Any] | None = None
    diagnosis: dict[str, Any] | None = None
    reason: str | None = None
    spot_checked: bool = False
    chain: ChainState | None = None
    refund: tuple[int, int] | None = None  # (refund, penalty) paid to the client
    batch: int | None = None  # the claimed batch that holds it

    @property
    def payable(self) -> bool:
        """Return whether a voucher should pay this task (verified, not settled otherwise)."""
        return self.state == TaskState.VERIFIED and self.chain in (None, ChainState.VOUCHED)

    @property
    def amount(self) -> int:
        """Return what the task costs the client (its receipt's amount once verified)."""
        return self.receipt.amount if self.receipt is not None and self.payable else 0

    def to_json(self) -> dict[str, Any]:
        """Return the record as JSON (bytes as 0x-hex)."""
        return {
            "index": self.index,
            "run": self.run,
            "label": self.label,
            "request": self.request.to_json(),
            "request_signature": _hex(self.request_signature),
            "target": self.target,
            "state": str(self.state),
            "ack": self.ack.to_json() if self.ack else None,
            "ack_signature": _hex(self.ack_signature),
            "receipt": self.receipt.to_json() if self.receipt else None,
            "receipt_signature": _hex(self.receipt_signature),
            "outputs": self.outputs,
            "result_state": self.result_state,
            "report": self.report,
            "diagnosis": self.diagnosis,
            "reason": self.reason,
            "spot_checked": self.spot_checked,
            "chain": str(self.chain) if self.chain else None,
            "refund": list(self.refund) if self.refund else None,
            "batch": self.batch,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> TaskRecord:
        """Build a record from ``to_json`` output."""
        refund = data.get("refund")
        return cls(
            index=int(data["index"]),
            run=int(data["run"]),
            label=str(data["label"]),
            request=TaskRequest.from_json(data["request"]),
            request_signature=_bytes(data["request_signature"]),
            target=data.get("target"),
            state=TaskState(data["state"]),
            ack=Ack.from_json(data["ack"]) if data.get("ack") else None,
            ack_signature=_bytes(data.get("ack_signature")),
            receipt=Receipt.from_json(data["receipt"]) if data.get("receipt") else None,
            receipt_signature=_bytes(data.get("receipt_signature")),
            outputs=data.get("outputs"),
            result_state=data.get("result_state"),
            report=data.get("report"),
            diagnosis=data.get("diagnosis"),
            reason=data.get("reason"),
            spot_checked=bool(data.get("spot_checked", False)),
            chain=ChainState(data["chain"]) if data.get("chain") else None,
            refund=(int(refund[0]), int(refund[1])) if refund else None,
            batch=None if data.get("batch") is None else int(data["batch"]),
        )


@dataclass(frozen=True)
class RunRecord:
    """One ``job run`` on the deal: finished when it reached its report."""

    run: int
    started_at: float
    finished: bool = False


@dataclass(frozen=True)
class BatchRecord:
    """A batch the provider claimed on chain, and what the client made of it."""

    batch: int
    amount: int
    tasks: tuple[int, ...]
    deadline: int  # end of its challenge window
    verdict: str  # accepted | disputed | missed (window over before the client saw it)
    reason: str = ""
    outcome: str | None = None  # provider_won | client_won, once the dispute ended

    def to_json(self) -> dict[str, Any]:
        """Return the record as JSON."""
        return {
            "batch": self.batch,
            "amount": self.amount,
            "tasks": list(self.tasks),
            "deadline": self.deadline,
            "verdict": self.verdict,
            "reason": self.reason,
            "outcome": self.outcome,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> BatchRecord:
        """Build a record from ``to_json`` output."""
        return cls(
            batch=int(data["batch"]),
            amount=int(data["amount"]),
            tasks=tuple(int(i) for i in data["tasks"]),
            deadline=int(data["deadline"]),
            verdict=str(data["verdict"]),
            reason=str(data.get("reason", "")),
            outcome=data.get("outcome"),
        )


def _hex(value: bytes) -> str:
    return "0x" + value.hex()


def _bytes(value: Any) -> bytes:
    return bytes.fromhex(str(value).removeprefix("0x")) if value else b""
