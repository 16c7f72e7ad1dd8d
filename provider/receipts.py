"""Pure core of task accounting: ack prices, receipts, voucher coverage, settlement instants.

No I/O: the service feeds it plans, requests and sandbox results and signs what it returns.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

from contracts.messages import KIND_COMPILE, STATUS_SUCCESS, Plan, Receipt, TaskRequest, Voucher
from contracts.pricing import price
from contracts.settle_by import settle_by as settle_by  # the one copy, used by the settlement jobs
from provider.diagnosis import Diagnosis
from provider.lifecycle import SettlementAction, TaskState
from provider.sandbox.results import CompileResult, InferenceResult, TaskFailure

if TYPE_CHECKING:
    from provider.journal import DealBook

SandboxOutcome = InferenceResult | CompileResult | TaskFailure


def ack_price(plan: Plan, request: TaskRequest) -> int:
    """Return the most the plan can charge for the request: the ack's price.

    A plan without a metered part charges exactly its (discounted) flat price for a success,
    and never more for a failure; a metered plan has no bound but the client's ``maxPrice``.
    """
    if plan.price_per_device_ms:
        return request.max_price
    return price(
        plan,
        kind=request.kind,
        status=STATUS_SUCCESS,
        cache_hit=False,
        device_ms=0,
        task_index=request.task_index,
    )


def canonical_json(data: Any) -> bytes:
    """Return the canonical JSON bytes whose sha256 a receipt's ``outputHash`` commits to."""
    return json.dumps(data, sort_keys=True, separators=(",", ":")).encode()


def diagnosis_to_json(diagnosis: Diagnosis) -> dict[str, Any]:
    """Return a diagnosis as the JSON object the API returns (and the failure output bytes)."""
    return {
        "category": diagnosis.category.value,
        "code": diagnosis.code,
        "message": diagnosis.message,
        "stage": None if diagnosis.stage is None else diagnosis.stage.value,
        "op": diagnosis.op,
        "required_bytes": diagnosis.required_bytes,
        "available_bytes": diagnosis.available_bytes,
        "hints": list(diagnosis.hints),
    }


def compile_report(result: CompileResult) -> dict[str, Any]:
    """Return a compile result as the JSON report delivered as the task's outputs."""
    return {
        "target": result.target,
        "platform": result.platform,
        "device_kind": result.device_kind,
        "compile_time_s": result.compile_time_s,
        "cache_hit": result.cache_hit,
        "memory": None if result.memory is None else asdict(result.memory),
        "memory_total_bytes": None if result.memory is None else result.memory.total_bytes,
        "cost": None if result.cost is None else asdict(result.cost),
        "available_bytes": result.available_bytes,
    }


def _ms(seconds: float) -> int:
    return max(0, math.ceil(seconds * 1000))


def delivery(outcome: SandboxOutcome) -> tuple[bytes, dict[str, Any], int, int, int, bool]:
    """Return (output bytes, detail JSON, status code, device ms, compile ms, cache hit).

    Output bytes: safetensors for an inference, the canonical JSON report for a compile, the
    canonical JSON diagnosis for a failure, so the receipt's ``outputHash`` always commits to
    exactly what the client receives.
    """
    if isinstance(outcome, InferenceResult):
        detail = {
            "state": TaskState.SUCCEEDED,
            "platform": outcome.platform,
            "device_kind": outcome.device_kind,
        }
        return (
            outcome.outputs,
            detail,
            STATUS_SUCCESS,
            _ms(outcome.device_time_s),
            _ms(outcome.compile_time_s),
            outcome.cache_hit,
        )
    if isinstance(outcome, CompileResult):
        report = compile_report(outcome)
        return (
            canonical_json(report),
            {"state": TaskState.SUCCEEDED, "report": report},
            STATUS_SUCCESS,
            0,
            _ms(outcome.compile_time_s),
            outcome.cache_hit,
        )
    diagnosis = diagnosis_to_json(outcome.diagnosis)
    return (
        canonical_json(diagnosis),
        {"state": TaskState.FAILED, "diagnosis": diagnosis},
        outcome.diagnosis.code,
        _ms(outcome.device_time_s),
        _ms(outcome.compile_time_s),
        False,
    )


def build_receipt(
    plan: Plan,
    request: TaskRequest,
    *,
    deadline: int,
    outputs: bytes,
    status: int,
    device_ms: int,
    compile_ms: int,
    cache_hit: bool,
    started_at: int,
    finished_at: int,
    prev_receipt_hash: bytes,
) -> Receipt:
    """Return the unsigned receipt of a task, its amount priced by the deal's plan.

    A compile runs on the host's compiler, not on a device: its ``deviceMs`` is 0.
    """
    device = 0 if request.kind == KIND_COMPILE else device_ms
    amount = price(
        plan,
        kind=request.kind,
        status=status,
        cache_hit=cache_hit,
        device_ms=device,
        task_index=request.task_index,
    )
    return Receipt(
        deal_id=request.deal_id,
        task_index=request.task_index,
        kind=request.kind,
        status=status,
        cache_hit=cache_hit,
        device_ms=device,
        compile_ms=compile_ms,
        program_hash=request.program_hash,
        input_hash=request.input_hash,
        output_hash=hashlib.sha256(outputs).digest(),
        started_at=started_at,
        finished_at=finished_at,
        deadline=deadline,
        amount=amount,
        prev_receipt_hash=prev_receipt_hash,
    )


def voucher_tasks(voucher: Voucher) -> list[int]:
    """Return the task indices a voucher's bitmap covers, ascending."""
    out = []
    for word_index, word in enumerate(voucher.tasks):
        bit = 0
        while word:
            if word & 1:
                out.append(word_index * 256 + bit)
            word >>= 1
            bit += 1
    return out


# ---- the deal's cap: every acked task stays payable ------------------------------------------
#
# The escrow pays a claim, a voucher's increase and a refund from one cap (``maxSpend``) and
# refuses any of them that does not fit (``EscrowCapExceeded``). A client cannot take what the
# cap holds for the provider's acked tasks by any call of its own but one: a voucher that pays
# more than the tasks it newly covers ("a tip"). Redeemed, its surplus uses cap that the claims
# of other acked tasks need, and those claims then revert. So the daemon keeps, for every deal,
#
#     cap_free = maxSpend - spent - unsettled - voucher_reserve >= 0
#
# and acks a task only if its ack price fits in ``cap_free``, and accepts (and redeems) a
# voucher only if ``cap_free`` stays >= 0 with it. Each term is what the chain can still take
# from the cap at most, read from the journal alone (a cached deal state could be stale):
#
# - ``spent``: the reservation fee, the last redeemed voucher, every claimed batch (pending,
#   paid, or refunded to the client by a dispute: the refund is at most the batch), and every
#   refunded task at its ack price (the refund is at most that);
# - ``unsettled``: the ack price of every acked task the chain has not settled yet: a claim of
#   it pays the receipt's amount, which the plan prices at most at the ack price (the ack price
#   of a metered plan is the request's maxPrice, the contract's bound); a refund pays the ack
#   price. A refund or claim the journal has not seen yet is still counted here, once;
# - ``voucher_reserve``: what the latest accepted voucher adds over the last redeemed one,
#   beyond the ack prices of the unsettled tasks it newly covers (already in ``unsettled``).
#
# Every step of an honest client and of the daemon keeps ``cap_free >= 0``: an ack takes at most
# what is free; a claim moves at most a task's ack price from ``unsettled`` to ``spent``; a
# redemption moves the voucher's increase to ``spent`` and its tasks out of ``unsettled``; a
# refund moves an ack price; a voucher that pays exactly its tasks' receipts reserves nothing.
# Only a tip reserves, and a tip larger than what is free is refused.


def cap_spent(book: DealBook, reservation_fee: int) -> int:
    """Return the most the chain has taken from a deal's cap, by the journal: the reservation
    fee, the last redeemed voucher, every claimed batch, every refund at its task's ack price."""
    redeemed = book.redeemed()
    spent = reservation_fee + (0 if redeemed is None else redeemed.voucher.cumulative_amount)
    for settlement in book.settlements:
        if settlement.action == SettlementAction.CLAIM:
            spent += int(settlement.data["amount"])
        elif settlement.action == SettlementAction.REFUNDED:  # the ack prices of the refunded tasks
            spent += int(settlement.data["refund"])
    return spent


def voucher_reserve(book: DealBook, voucher: Voucher | None) -> int:
    """Return what redeeming ``voucher`` would take from the cap beyond the ack prices of the
    unsettled tasks it newly covers (those are counted as unsettled already): its tip."""
    if voucher is None:
        return 0
    redeemed = book.redeemed()
    outstanding = voucher.cumulative_amount - (
        0 if redeemed is None else redeemed.voucher.cumulative_amount
    )
    if outstanding <= 0:
        return 0
    covered = 0
    for index in voucher_tasks(voucher):
        record = book.acks.get(index)
        if record is not None and not book.on_chain(index):
            covered += record.ack.price
    return max(0, outstanding - covered)


def cap_free(
    book: DealBook, voucher: Voucher | None, *, max_spend: int, reservation_fee: int
) -> int:
    """Return what a deal's cap keeps free once everything the chain may still take from it is
    set aside, ``voucher`` being the provider's latest voucher (negative: the cap is short, and
    some acked task could not be paid; see the comment above)."""
    return (
        max_spend
        - cap_spent(book, reservation_fee)
        - book.unpaid_ack_total()
        - voucher_reserve(book, voucher)
    )
