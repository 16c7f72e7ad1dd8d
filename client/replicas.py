"""Replicated tasks (refereed delegation): one task run by several providers, outputs compared.

The client sends the same task (the same program envelope) to two providers under two deals
naming the same arbiter, and compares the outputs within that arbiter's published tolerance
(``GET /v1/info``; the comparison is the arbiter's own, :class:`contracts.evidence.Tolerance`).
Replicas that agree are paid as any verified delivery. Replicas that disagree are paid by
neither voucher: each provider claims its receipt on chain, and :class:`ReplicaReferee`
disputes every such claim and hands the arbiter the program envelope; the arbiter re-executes
the task and rules, so the replica that agrees with its re-execution is paid and the other's
claim is refunded to the client with the penalty (and pays the arbiter's fee, if any).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import httpx

from client.accounts import ClientAccount
from client.errors import ClientError
from client.watch import deal_logs
from contracts.binding import BATCH_PAID, BATCH_PENDING, BATCH_REJECTED
from contracts.evidence import (
    EvidenceUploadError,
    Role,
    Tolerance,
    compare_outputs,
    tolerance_from_policy,
    upload_evidence,
)


class ReplicaError(ClientError):
    """Replicas cannot be compared or refereed; the message says why."""


@dataclass(frozen=True, slots=True)
class Replica:
    """One provider's delivery of the replicated task: its deal, task index and outputs."""

    deal_id: int
    task_index: int
    outputs: bytes


@dataclass(frozen=True, slots=True)
class Comparison:
    """Whether replicas agree; when not, why each differs from the first."""

    agree: bool
    differences: tuple[str | None, ...]


def arbiter_tolerance(arbiter_url: str, *, timeout_s: float = 10.0) -> Tolerance:
    """Return the tolerance policy the arbiter at ``arbiter_url`` publishes."""
    try:
        info = httpx.get(arbiter_url.rstrip("/") + "/v1/info", timeout=timeout_s).json()
        return tolerance_from_policy(info["tolerance"])
    except (httpx.HTTPError, ValueError, KeyError, TypeError) as exc:
        raise ReplicaError(f"arbiter at {arbiter_url} gave no tolerance policy: {exc}") from None


def compare_replicas(replicas: Sequence[Replica], tolerance: Tolerance) -> Comparison:
    """Compare every replica's outputs with the first's within ``tolerance``."""
    if len(replicas) < 2:
        raise ReplicaError("a replicated task needs at least two replicas")
    first = replicas[0].outputs
    differences = (None, *(compare_outputs(r.outputs, first, tolerance) for r in replicas[1:]))
    return Comparison(agree=all(d is None for d in differences), differences=differences)


class ReplicaReferee:
    """Dispute the claims of disagreeing replicas and hand the arbiter the program of each."""

    def __init__(
        self,
        *,
        account: ClientAccount,
        arbiter_url: str,
        from_block: int = 0,
        say: Callable[[str], None] = lambda _: None,
    ) -> None:
        """Act for ``account`` with the arbiter at ``arbiter_url``; scan from ``from_block``."""
        self.account = account
        self.escrow = account.escrow
        self.arbiter_url = arbiter_url
        self.from_block = from_block
        self.say = say

    def claimed_batch(self, replica: Replica) -> int | None:
        """Return the batch claiming the replica's task, or None while it is not claimed."""
        latest = int(self.escrow.tx.w3.eth.block_number)
        logs = deal_logs(self.escrow, "ReceiptsClaimed", replica.deal_id, self.from_block, latest)
        for _, args in logs:
            if replica.task_index in [int(i) for i in args["taskIndexes"]]:
                return int(args["batchId"])
        return None

    def dispute(self, replica: Replica) -> int | None:
        """Dispute the claim of ``replica``'s task (once); return its batch (None: unclaimed)."""
        batch_id = self.claimed_batch(replica)
        if batch_id is None:
            return None
        deal = self.escrow.get_deal(replica.deal_id)
        if deal.arbiter.lower() not in self._arbiter_addresses():
            raise ReplicaError(f"deal {replica.deal_id} names another arbiter ({deal.arbiter})")
        if self.escrow.get_batch(replica.deal_id, batch_id).status == BATCH_PENDING:
            self.account.dispute(replica.deal_id, batch_id)
            self.say(f"disputed deal {replica.deal_id} batch {batch_id}: replicas disagree")
        return batch_id

    def hand_over(self, replica: Replica, batch_id: int, envelope: bytes) -> bool:
        """Upload the task's program envelope to the arbiter; return False while the arbiter
        has not taken the dispute yet (call again), True once it holds the program (or has
        ruled the case already)."""
        try:
            upload_evidence(
                self.arbiter_url,
                self.escrow.domain,
                self.account.key,
                deal_id=replica.deal_id,
                batch_id=batch_id,
                task_index=replica.task_index,
                role=Role.CLIENT_PROGRAM,
                body=envelope,
            )
        except EvidenceUploadError as exc:
            if "unknown_case" in str(exc):
                return False
            if "case_closed" in str(exc):
                return True  # ruled already: nothing left to hand over
            raise
        return True

    def outcome(self, replica: Replica, batch_id: int) -> bool | None:
        """Return whether the ruling paid ``replica`` (True), refunded it (False), or None yet."""
        status = self.escrow.get_batch(replica.deal_id, batch_id).status
        if status == BATCH_PAID:
            return True
        if status == BATCH_REJECTED:
            return False
        return None

    def _arbiter_addresses(self) -> set[str]:
        try:
            info = httpx.get(self.arbiter_url.rstrip("/") + "/v1/info", timeout=10).json()
            return {str(info["arbiter"]).lower()}
        except (httpx.HTTPError, ValueError, KeyError, TypeError) as exc:
            raise ReplicaError(f"arbiter at {self.arbiter_url} not reachable: {exc}") from None
