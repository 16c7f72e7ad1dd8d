"""The arbiter at work: find disputes that name it, take evidence, re-execute, rule on chain.

Timing (chain time, the clock both parties and the escrow share): evidence is taken until
``disputed_at + evidence_window_s``, but never later than ``arbitration_deadline -
ruling_margin_s``, so the ruling is sent with a margin before the dispute would lapse. A case
whose evidence is complete (both parties, every task) is ruled at once.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from contracts.binding import BATCH_DISPUTED, Escrow
from contracts.errors import ChainError, ContractRevert, SignatureError
from contracts.evidence import Role, evidence_digest
from contracts.hashing import keccak256
from contracts.messages import KIND_COMPILE, recover_digest
from programs.envelope import (
    ProgramFormatError,
    decode_envelope,
    request_input_hash,
)
from provider.arbiter.cases import Dispute, disputed_events, load_dispute
from provider.arbiter.errors import EvidenceRefused
from provider.arbiter.journal import ArbiterJournal, Case, CaseState
from provider.arbiter.rules import (
    Rerun,
    TaskFacts,
    TaskRuling,
    Tolerance,
    judge_rerun,
    judge_without_rerun,
    provider_wins,
)
from provider.receipts import delivery
from provider.sandbox import Sandbox

log = logging.getLogger("provider.arbiter")


@dataclass(frozen=True, slots=True)
class ArbiterTerms:
    """What the arbiter publishes and keeps to: deadlines and the tolerance policy."""

    evidence_window_s: int = 600
    ruling_margin_s: int = 300
    tolerance: Tolerance = field(default_factory=Tolerance)
    fee: int = 0

    def evidence_deadline(self, dispute: Dispute) -> int:
        """Return the chain instant after which no more evidence is taken for ``dispute``."""
        return min(
            dispute.disputed_at + self.evidence_window_s,
            dispute.arbitration_deadline - self.ruling_margin_s,
        )


class Arbiter:
    """One arbiter key's disputes on one escrow."""

    def __init__(
        self,
        *,
        escrow: Escrow,
        key: str,
        journal: ArbiterJournal,
        sandbox: Callable[[], Sandbox],
        terms: ArbiterTerms,
        from_block: int = 0,
    ) -> None:
        """Watch ``escrow`` for disputes naming the address of ``key``, from ``from_block``."""
        self.escrow = escrow
        self._key = key
        self.address = escrow.tx.address_of(key)
        self.journal = journal
        self.terms = terms
        self._sandbox_factory = sandbox
        self._sandbox: Sandbox | None = None
        self._from_block = from_block
        self.domain = escrow.domain

    def close(self) -> None:
        """Stop the re-execution sandbox."""
        if self._sandbox is not None:
            self._sandbox.close()
            self._sandbox = None

    def chain_now(self) -> int:
        """Return the latest block's timestamp."""
        return int(self.escrow.tx.w3.eth.get_block("latest")["timestamp"])

    # ---- finding disputes ------------------------------------------------------------

    def scan(self) -> list[Dispute]:
        """Record the disputes naming this arbiter since the last scan; return the new ones."""
        start = self.journal.next_block(self._from_block)
        latest = int(self.escrow.tx.w3.eth.block_number)
        if start > latest:
            return []
        found = []
        for block, args in disputed_events(self.escrow, start, latest):
            deal_id, batch_id = int(args["dealId"]), int(args["batchId"])
            if self.journal.case(deal_id, batch_id) is not None:
                continue
            if self.escrow.get_deal(deal_id).arbiter.lower() != self.address.lower():
                continue
            found.append(load_dispute(self.escrow, deal_id, batch_id, block))
        self.journal.add_cases(found, latest + 1)
        for d in found:
            log.info(
                "dispute taken",
                extra={"deal": d.deal_id, "batch": d.batch_id, "tasks": len(d.tasks)},
            )
        return found

    # ---- evidence ----------------------------------------------------------------------

    def accept(
        self,
        key: tuple[int, int],
        task_index: int,
        role: Role,
        temp: Path,
        sha256: bytes,
        signature: bytes,
        target: str | None,
    ) -> None:
        """Check one upload (sender, timing, hashes) and store it, or raise EvidenceRefused."""
        case = self.journal.case(*key)
        if case is None:
            raise EvidenceRefused(404, "unknown_case", "no dispute of this batch names me (yet)")
        if case.state is not CaseState.OPEN:
            raise EvidenceRefused(409, "case_closed", "this dispute is already ruled")
        dispute = case.dispute
        if self.chain_now() > self.terms.evidence_deadline(dispute):
            raise EvidenceRefused(409, "evidence_late", "the evidence period is over")
        task = next((t for t in dispute.tasks if t.receipt.task_index == task_index), None)
        if task is None:
            raise EvidenceRefused(404, "unknown_task", f"task {task_index} is not in this batch")
        sender = dispute.client if role is Role.CLIENT_PROGRAM else dispute.provider
        digest = evidence_digest(self.domain, *key, task_index, role, sha256)
        try:
            signer = recover_digest(digest, signature)
        except SignatureError as exc:
            raise EvidenceRefused(401, "bad_signature", str(exc)) from exc
        if signer.lower() != sender.lower():
            raise EvidenceRefused(403, "wrong_sender", "the signature is not the right party's")
        receipt = task.receipt
        if role is Role.PROVIDER_OUTPUTS:
            if sha256 != receipt.output_hash:
                raise EvidenceRefused(422, "not_receipted", "these outputs are not the receipt's")
        else:
            try:
                envelope = decode_envelope(temp.read_bytes())
                input_hash = request_input_hash(
                    receipt.kind, envelope, target if receipt.kind == KIND_COMPILE else None
                )
            except ProgramFormatError as exc:
                raise EvidenceRefused(422, "bad_program", str(exc)) from exc
            if envelope.program_sha256 != receipt.program_hash or input_hash != receipt.input_hash:
                raise EvidenceRefused(
                    422, "not_signed", "this program and inputs are not what the client signed"
                )
        self.journal.store_evidence(key, task_index, role, temp, sha256, target)

    def missing(self, case: Case) -> dict[str, list[int]]:
        """Return, per party, the tasks whose evidence has not come."""
        have = self.journal.evidence(case.key)
        tasks = [t.receipt.task_index for t in case.dispute.tasks]
        return {
            "client": [i for i in tasks if (i, Role.CLIENT_PROGRAM) not in have],
            "provider": [i for i in tasks if (i, Role.PROVIDER_OUTPUTS) not in have],
        }

    # ---- ruling ------------------------------------------------------------------------

    def tick(self) -> list[dict[str, Any]]:
        """Scan, rule every case that is ready, confirm sent rulings; return new rulings."""
        self.scan()
        now = self.chain_now()
        ruled = []
        for case in self.journal.cases(CaseState.OPEN):
            missing = self.missing(case)
            complete = not missing["client"] and not missing["provider"]
            if complete or now > self.terms.evidence_deadline(case.dispute):
                ruling = self.decide(case, now)
                self.journal.record_ruling(case.key, ruling)
                ruled.append(ruling)
        for case in self.journal.cases(CaseState.RULED):
            self._send(case)
        return ruled

    def decide(self, case: Case, now: int) -> dict[str, Any]:
        """Decide a case from its evidence; return the ruling document."""
        have = self.journal.evidence(case.key)
        rulings: list[TaskRuling] = []
        evidence: dict[str, Any] = {}
        for task in case.dispute.tasks:
            receipt = task.receipt
            index = receipt.task_index
            outputs_ev = have.get((index, Role.PROVIDER_OUTPUTS))
            program_ev = have.get((index, Role.CLIENT_PROGRAM))
            outputs = None if outputs_ev is None else outputs_ev.path.read_bytes()
            facts = TaskFacts(
                task_index=index,
                status=receipt.status,
                output_hash=receipt.output_hash,
                outputs=outputs,
                outputs_sha256=None if outputs is None else hashlib.sha256(outputs).digest(),
                program_ok=None if program_ev is None else True,
            )
            ruling = judge_without_rerun(facts)
            if ruling is None:
                assert program_ev is not None
                rerun = self._rerun(receipt.kind, program_ev.path.read_bytes(), program_ev.target)
                ruling = judge_rerun(
                    facts, rerun, self.terms.tolerance, compile_task=receipt.kind == KIND_COMPILE
                )
            rulings.append(ruling)
            evidence[str(index)] = {
                "program_sha256": None if program_ev is None else program_ev.sha256.hex(),
                "outputs_sha256": None if outputs_ev is None else outputs_ev.sha256.hex(),
            }
        wins = provider_wins(rulings)
        return {
            "deal": case.dispute.deal_id,
            "batch": case.dispute.batch_id,
            "arbiter": self.address,
            "provider_wins": wins,
            "decided_at": now,
            "tasks": [r.as_json() for r in rulings],
            "evidence": evidence,
            "tolerance": self.terms.tolerance.as_json(),
        }

    def _rerun(self, kind: int, envelope: bytes, target: str | None) -> Rerun:
        if self._sandbox is None:
            self._sandbox = self._sandbox_factory()
        if kind == KIND_COMPILE:
            outcome: Any = self._sandbox.compile(envelope, target or "local")
        else:
            outcome = self._sandbox.run(envelope)
        outputs, _detail, status, *_ = delivery(outcome)
        return Rerun(status=status, outputs=outputs, kind=kind)

    def _send(self, case: Case) -> None:
        """Send a journaled ruling, unless the chain already holds the batch's outcome."""
        assert case.ruling is not None
        deal_id, batch_id = case.key
        batch = self.escrow.get_batch(deal_id, batch_id)
        if batch.status != BATCH_DISPUTED:
            self.journal.record_sent(case.key, None, done=True)
            return
        document = ruling_bytes(case.ruling)
        data = self.escrow.contract.encode_abi(
            "resolveDispute", args=[deal_id, batch_id, bool(case.ruling["provider_wins"])]
        )
        # The ruling document's hash rides after the call's arguments: the escrow ignores it,
        # the chain keeps it, and anyone can check the served document against it.
        data += keccak256(document).hex()
        try:
            receipt = self.escrow.tx.send(self._key, self.escrow.address, data)
        except (ContractRevert, ChainError) as exc:
            log.error(
                "ruling not sent", extra={"deal": deal_id, "batch": batch_id, "error": str(exc)}
            )
            return
        tx_hash = receipt["transactionHash"].to_0x_hex()
        self.journal.record_sent(case.key, tx_hash, done=True)
        log.info(
            "ruled",
            extra={
                "deal": deal_id,
                "batch": batch_id,
                "provider_wins": case.ruling["provider_wins"],
                "tx": tx_hash,
            },
        )


def ruling_bytes(ruling: dict[str, Any]) -> bytes:
    """Return the canonical bytes of a ruling document (its hash goes on chain)."""
    import json

    return json.dumps(ruling, sort_keys=True, separators=(",", ":")).encode()
