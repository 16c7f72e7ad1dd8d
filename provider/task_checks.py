"""Task intake checks: a signed request proven to be its deal client's, its terms and envelope.

Everything here runs before an ack exists, so a refusal bills nothing. Each refusal is a
:class:`provider.errors.RejectedError` with a stable code, counted by code and logged.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass

from contracts.binding import DEAL_OPEN, DealState
from contracts.errors import SignatureError
from contracts.messages import (
    KIND_COMPILE,
    KIND_INFERENCE,
    Domain,
    Plan,
    TaskRequest,
    recover_digest,
)
from programs.envelope import (
    ProgramEnvelope,
    ProgramFormatError,
    decode_envelope,
    request_input_hash,
)
from provider.config import SettlementConfig
from provider.counterparty import CounterpartyCode
from provider.deals import DealCache
from provider.errors import RejectedError
from provider.metrics import ProviderMetrics
from provider.sandbox import Sandbox
from provider.signing import DomainSigner
from provider.task_index import OUT_OF_RANGE, range_problem
from provider.wire import MAX_JSON_DEPTH, json_depth, parse_signature, shorten

# The task service's logger: its lines and the filters on them stay as they were.
log = logging.getLogger("provider.service")
KIND_NAMES = {KIND_COMPILE: "compile", KIND_INFERENCE: "inference"}
"""Task kinds by their metric label."""


@dataclass(frozen=True, slots=True)
class CheckedRequest:
    """A TaskRequest proven to be its deal client's (:meth:`TaskChecks.check_request`)."""

    request: TaskRequest
    request_hash: bytes
    signature: bytes
    deal: DealState


class TaskChecks:
    """Check signed task requests, their deal's terms and their envelopes for one provider."""

    def __init__(
        self,
        *,
        address: str,
        domain: Domain,
        deals: DealCache,
        sandbox: Sandbox,
        signer: DomainSigner,
        slo_s: int,
        settlement: SettlementConfig,
        max_envelope_bytes: int,
        metrics: ProviderMetrics,
        counterparty: CounterpartyCode,
    ) -> None:
        """Check requests to ``address`` under ``domain`` against ``deals``' state on chain;
        ``counterparty`` judges the code of each deal's client."""
        self.address = address
        self.domain = domain
        self.deals = deals
        self.sandbox = sandbox
        self.signer = signer
        self.slo_s = slo_s
        self.settlement = settlement
        self.max_envelope_bytes = max_envelope_bytes
        self.metrics = metrics
        self.counterparty = counterparty

    def reject(self, code: str, reason: str) -> RejectedError:
        """Count and log a refused task; return the error to raise."""
        self.metrics.tasks_rejected.labels(code).inc()
        log.info("task rejected", extra={"code": code, "reason": reason})
        return RejectedError(code, reason)

    def check_request(self, request_json: str, signature: str) -> CheckedRequest:
        """Parse a signed TaskRequest and check it is the deal's client's, for this provider.

        Cheap (no envelope needed): the API runs it before it reads a task's body, so a
        stranger's upload is refused before a byte of it is read.
        """
        request, request_hash = self.parse_request(request_json)
        sig = parse_signature(signature)
        deal = self.deals.get(request.deal_id)
        if deal.provider.lower() != self.address.lower():
            raise self.reject(
                "deal_not_ours", f"deal {request.deal_id} names provider {deal.provider}"
            )
        try:
            signer = recover_digest(self.signer.digest(request_hash), sig)
        except SignatureError as exc:
            raise self.reject("signature_invalid", str(exc)) from exc
        if signer.lower() != deal.client.lower():
            raise self.reject(
                "signature_invalid",
                f"TaskRequest signed by {signer}, but deal {request.deal_id}'s client is "
                f"{deal.client} (forged, or signed for another deal, chain or escrow "
                f"than chain {self.domain.chain_id} escrow {self.domain.verifying_contract})",
            )
        return CheckedRequest(request, request_hash, sig, deal)

    def parse_request(self, request_json: str) -> tuple[TaskRequest, bytes]:
        """Parse a TaskRequest header and hash it; any malformed or out-of-range one is a 400."""
        try:
            if json_depth(request_json) > MAX_JSON_DEPTH:
                raise ValueError(f"nested deeper than {MAX_JSON_DEPTH}")
            request = TaskRequest.from_json(json.loads(request_json))
            if not 0 <= request.deal_id < 2**256 or not 0 <= request.task_index < 2**32:
                raise ValueError("dealId or taskIndex out of range")
            return request, request.struct_hash()
        except (ValueError, TypeError, KeyError, AttributeError, OverflowError) as exc:
            raise self.reject("bad_request", f"malformed TaskRequest: {shorten(exc)}") from exc

    def check_terms(self, request: TaskRequest, deal: DealState, now: float) -> Plan:
        """Refuse a task its deal cannot take now; return the deal's plan.

        The index must be one the escrow can settle; the deal open, unexpired and not agreed
        closed by its client, its challenge window one the settlement jobs can meet, its plan
        one this provider quoted, its client an account whose signatures cannot be withdrawn
        (:mod:`provider.counterparty`); the deadline one this provider can meet and not past
        the deal's expiry.
        """
        problem = range_problem(request)
        if problem is not None:
            raise self.reject(OUT_OF_RANGE, problem)
        if deal.status != DEAL_OPEN:
            raise self.reject("deal_not_open", f"deal {request.deal_id} is closed")
        if deal.client_agreed_close:
            # A task acked now could breach after an early close had returned its funds.
            raise self.reject(
                "deal_closing",
                f"deal {request.deal_id}'s client agreed to close it: it takes no new task",
            )
        if now >= deal.expiry:
            raise self.reject("deal_expired", f"deal {request.deal_id} expired at {deal.expiry}")
        problem = self.settlement.window_problem(deal.challenge_window)
        if problem is not None:
            raise self.reject("window_too_short", f"deal {request.deal_id}: {problem}")
        self.counterparty.check(deal.client, request.deal_id, self.reject)
        if request.deadline < now + self.slo_s:
            raise self.reject(
                "deadline_too_soon",
                f"deadline {request.deadline} is {request.deadline - now:.1f} s away; this "
                f"provider needs at least its SLO of {self.slo_s} s (set deadline = now + "
                f"{self.slo_s} + a few seconds of slack)",
            )
        if request.deadline > deal.expiry:
            raise self.reject(
                "deadline_after_expiry",
                f"deadline {request.deadline} is after deal {request.deal_id}'s expiry "
                f"{deal.expiry}",
            )
        plan = self.deals.plan_of(deal)
        if plan is None:
            raise self.reject(
                "unknown_plan", f"deal {request.deal_id} uses a plan this provider never quoted"
            )
        return plan

    def check_envelope(
        self, request: TaskRequest, target: str | None, data: bytes
    ) -> ProgramEnvelope:
        """Decode a task's envelope; refuse it unless it is the one the request hashes."""
        if request.kind not in KIND_NAMES:
            raise self.reject("bad_request", f"unknown task kind {request.kind}")
        if request.kind == KIND_COMPILE and target is None:
            raise self.reject("bad_request", "a compile task needs a target header")
        if request.kind == KIND_INFERENCE and target is not None:
            raise self.reject("bad_request", "an inference task takes no target")
        refusal = None if target is None else self.sandbox.target_refusal(target)
        if refusal is not None:  # refused before the ack: nothing is billed
            raise self.reject("target_unsupported", refusal)
        if len(data) > self.max_envelope_bytes:
            raise self.reject(
                "envelope_too_large", f"{len(data)} bytes, cap {self.max_envelope_bytes}"
            )
        try:
            envelope = decode_envelope(data, max_bytes=self.max_envelope_bytes)
            input_hash = request_input_hash(request.kind, envelope, target)
        except ProgramFormatError as exc:
            raise self.reject("envelope_malformed", str(exc)) from exc
        if envelope.program_sha256 != request.program_hash:
            raise self.reject(
                "hash_mismatch", "programHash of the request differs from the envelope's program"
            )
        if input_hash != request.input_hash:
            raise self.reject(
                "hash_mismatch",
                "inputHash of the request differs from the envelope's inputs"
                + (f" bound to target {target!r}" if target is not None else ""),
            )
        # What the envelope states that a worker would refuse (a newer JAX or StableHLO, a
        # platform this task cannot run on) is refused now, before the ack: nothing billed.
        stated = self.sandbox.envelope_refusal(envelope, target)
        if stated is not None:
            raise self.reject(*stated)
        return envelope


__all__ = ["KIND_NAMES", "CheckedRequest", "TaskChecks"]
