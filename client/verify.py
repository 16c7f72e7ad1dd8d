"""Verification of a provider's delivery before the client pays for it.

A delivery is paid only if every check passes: the receipt is signed by the deal's provider,
it names the task the client asked for, its hashes match the program and inputs the client
sent and the output bytes it received, its amount is the plan's price for the reported usage
(and within the request's maximum), and it finished by the request's deadline (the one the
client signed and the provider's ack committed to).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from client.errors import DeliveryRejected
from contracts.errors import SignatureError
from contracts.messages import ZERO_HASH, Ack, Domain, Plan, Receipt, TaskRequest, verify
from contracts.pricing import price_receipt
from programs.envelope import ArrayFormat, ProgramEnvelope, decode_arrays, outputs_hash


@dataclass(frozen=True)
class Delivery:
    """What the provider returned for one task, with the ack it gave when accepting it."""

    request: TaskRequest
    ack: Ack
    receipt: Receipt
    receipt_signature: bytes
    output: bytes


def verify_delivery(delivery: Delivery, *, domain: Domain, provider: str, plan: Plan) -> Receipt:
    """Return the receipt if the delivery may be paid; raise DeliveryRejected otherwise."""
    request, ack, receipt = delivery.request, delivery.ack, delivery.receipt
    index = request.task_index

    def reject(reason: str) -> DeliveryRejected:
        return DeliveryRejected(index, reason)

    try:
        verify(receipt, domain, delivery.receipt_signature, provider)
    except SignatureError as exc:
        raise reject(f"receipt signature: {exc}") from exc
    if (receipt.deal_id, receipt.task_index, receipt.kind) != (
        request.deal_id,
        request.task_index,
        request.kind,
    ):
        raise reject("receipt names another deal, task or kind than the request")
    if receipt.program_hash != request.program_hash or receipt.input_hash != request.input_hash:
        raise reject("receipt hashes another program or other inputs than the request")
    if receipt.output_hash != outputs_hash(delivery.output):
        raise reject("output bytes do not match the receipt's output hash")
    priced = price_receipt(plan, receipt)
    if receipt.amount != priced:
        raise reject(f"amount {receipt.amount} differs from the plan's price {priced}")
    if receipt.amount > request.max_price:
        raise reject(f"amount {receipt.amount} exceeds the request's maximum {request.max_price}")
    if (ack.deal_id, ack.task_index, ack.request_hash) != (
        request.deal_id,
        request.task_index,
        request.struct_hash(),
    ):
        raise reject("the provider's ack answers another request")
    if receipt.deadline != request.deadline:
        raise reject(f"receipt deadline {receipt.deadline} differs from the request's")
    if receipt.amount > ack.price:
        raise reject(f"amount {receipt.amount} exceeds the acked price {ack.price}")
    if receipt.finished_at > request.deadline:
        raise reject(f"delivered at {receipt.finished_at}, after the deadline {request.deadline}")
    if receipt.started_at > receipt.finished_at:
        raise reject("receipt finished before it started")
    return receipt


def check_chain(receipts: Sequence[Receipt]) -> None:
    """Raise DeliveryRejected unless `receipts` (in provider order) chain by hash from zero."""
    previous = ZERO_HASH
    for receipt in receipts:
        if receipt.prev_receipt_hash != previous:
            raise DeliveryRejected(receipt.task_index, "receipt chain is broken before this task")
        previous = receipt.struct_hash()


def spot_check(index: int, envelope: ProgramEnvelope, outputs: bytes, tolerance: float) -> None:
    """Run an inference program locally and compare its outputs with the delivered ones.

    Raise ``DeliveryRejected`` when an output is missing, misshapen, or differs by more than
    ``tolerance`` (absolute and relative).
    """
    from client.models.jax_export import run_local

    expected = run_local(envelope)
    delivered = decode_arrays(outputs, ArrayFormat.SAFETENSORS)
    for i, want in enumerate(expected):
        got = delivered.get(str(i))
        if got is None or got.shape != want.shape:
            raise DeliveryRejected(index, f"spot check: output {i} missing or misshapen")
        if not np.allclose(got, want, atol=tolerance, rtol=tolerance):
            worst = float(np.max(np.abs(got.astype(np.float64) - want.astype(np.float64))))
            raise DeliveryRejected(index, f"spot check: output {i} differs by {worst:.3g}")
