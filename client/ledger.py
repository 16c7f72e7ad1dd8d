"""A client's record of one deal, kept on disk between runs of ``tpumarket job``.

Vouchers are cumulative: the voucher a second run signs must pay the first run's tasks too,
and task indices must never repeat. The ledger keeps, per (chain, escrow, deal): the next free
task index, what each verified task costs, the last voucher signed, tasks settled on chain
without a voucher, and the acks of tasks not (yet) verified, so a later run can refund them.

Indices are reserved (and the file written) *before* tasks are submitted, and the file is
replaced atomically, so a crash can waste indices but never reuse one.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from client.errors import ClientError
from contracts.messages import Ack

FORMAT = 1


class LedgerError(ClientError):
    """The deal's ledger file cannot be read, or belongs to another deal."""


@dataclass(frozen=True)
class PendingAck:
    """An acked task with no verified delivery: refundable once its deadline has passed."""

    ack: Ack
    signature: bytes
    reason: str


@dataclass
class DealLedger:
    """What this client submitted and paid in one deal; ``save`` writes it atomically."""

    path: Path
    chain_id: int
    escrow: str
    deal_id: int
    next_index: int = 0
    paid: dict[int, int] = field(default_factory=dict)
    claimed: set[int] = field(default_factory=set)
    last_signed: int = 0
    pending: dict[int, PendingAck] = field(default_factory=dict)
    refunded: dict[int, tuple[int, int]] = field(default_factory=dict)

    @classmethod
    def open(cls, state_dir: Path, chain_id: int, escrow: str, deal_id: int) -> DealLedger:
        """Load the deal's ledger from ``state_dir``, or start an empty one."""
        path = state_dir / f"deal-{chain_id}-{escrow.lower()}-{deal_id}.json"
        ledger = cls(path=path, chain_id=chain_id, escrow=escrow.lower(), deal_id=deal_id)
        if not path.exists():
            return ledger
        try:
            data = json.loads(path.read_text())
            if data.get("format") != FORMAT:
                raise LedgerError(f"{path}: unknown ledger format {data.get('format')!r}")
            if (data["chain_id"], data["escrow"], data["deal_id"]) != (
                chain_id,
                escrow.lower(),
                deal_id,
            ):
                raise LedgerError(f"{path} belongs to another deal")
            ledger.next_index = int(data["next_index"])
            ledger.paid = {int(k): int(v) for k, v in data["paid"].items()}
            ledger.claimed = {int(i) for i in data["claimed"]}
            ledger.last_signed = int(data["last_signed"])
            ledger.pending = {
                int(k): PendingAck(
                    Ack.from_json(v["ack"]), bytes.fromhex(v["signature"][2:]), str(v["reason"])
                )
                for k, v in data["pending"].items()
            }
            ledger.refunded = {int(k): (int(a), int(b)) for k, (a, b) in data["refunded"].items()}
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise LedgerError(f"cannot read the deal ledger {path}: {exc}") from exc
        return ledger

    def reserve(self, count: int) -> int:
        """Reserve ``count`` task indices, write the ledger, and return the first."""
        first = self.next_index
        self.next_index += count
        self.save()
        return first

    def save(self) -> None:
        """Write the ledger atomically (a temporary file renamed over the old one)."""
        data: dict[str, Any] = {
            "format": FORMAT,
            "chain_id": self.chain_id,
            "escrow": self.escrow,
            "deal_id": self.deal_id,
            "next_index": self.next_index,
            "paid": {str(k): v for k, v in sorted(self.paid.items())},
            "claimed": sorted(self.claimed),
            "last_signed": self.last_signed,
            "pending": {
                str(k): {
                    "ack": p.ack.to_json(),
                    "signature": "0x" + p.signature.hex(),
                    "reason": p.reason,
                }
                for k, p in sorted(self.pending.items())
            },
            "refunded": {str(k): list(v) for k, v in sorted(self.refunded.items())},
        }
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            temporary = self.path.with_suffix(".tmp")
            with temporary.open("w") as out:
                json.dump(data, out, indent=1)
                out.flush()
                os.fsync(out.fileno())
            os.replace(temporary, self.path)
        except OSError as exc:
            raise LedgerError(f"cannot write the deal ledger {self.path}: {exc}") from exc
