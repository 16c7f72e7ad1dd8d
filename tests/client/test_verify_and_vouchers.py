"""Delivery verification and cumulative vouchers: what the client pays, and what it refuses."""

from __future__ import annotations

import os
from dataclasses import replace

import pytest

from client.errors import ClientError, DeliveryRejected, SpendingCapExceeded
from client.verify import Delivery, check_chain, verify_delivery
from client.vouchers import VoucherBook
from contracts.messages import (
    KIND_INFERENCE,
    STATUS_SUCCESS,
    ZERO_HASH,
    Ack,
    Domain,
    Plan,
    Receipt,
    TaskRequest,
    address_of,
)
from contracts.pricing import price_receipt
from programs.envelope import outputs_hash

DOMAIN = Domain(chain_id=31337, verifying_contract="0x" + "ab" * 20)
PROVIDER_KEY = "0x" + "11" * 32
PLAN = Plan(inference_price=500, price_per_device_ms=3)


def _delivery(index: int = 0, output: bytes = b"result-bytes", **changes: object) -> Delivery:
    request = TaskRequest(7, index, KIND_INFERENCE, os.urandom(32), os.urandom(32), 10_000, 1_000)
    ack = Ack(7, index, request.struct_hash(), 1_000)
    draft = Receipt(
        7, index, KIND_INFERENCE, STATUS_SUCCESS, False, 40, 0,
        request.program_hash, request.input_hash, outputs_hash(output),
        900, 950, request.deadline, 0, ZERO_HASH,
    )  # fmt: skip
    receipt = replace(replace(draft, amount=price_receipt(PLAN, draft)), **changes)  # type: ignore[arg-type]
    return Delivery(request, ack, receipt, receipt.sign(DOMAIN, PROVIDER_KEY), output)


def _verify(delivery: Delivery) -> Receipt:
    return verify_delivery(delivery, domain=DOMAIN, provider=address_of(PROVIDER_KEY), plan=PLAN)


def test_verify_when_delivery_is_honest_then_returns_receipt() -> None:
    delivery = _delivery()
    assert _verify(delivery) == delivery.receipt


@pytest.mark.parametrize(
    ("changes", "reason"),
    [
        ({"amount": 621}, "plan's price"),
        ({"output_hash": b"\x01" * 32}, "output bytes"),
        ({"program_hash": b"\x02" * 32}, "another program"),
        ({"task_index": 5}, "another deal"),
        ({"finished_at": 1_001}, "after the deadline"),
        ({"deadline": 2_000, "finished_at": 1_500}, "differs from the request's"),
    ],
)
def test_verify_when_receipt_is_wrong_then_rejects_with_reason(
    changes: dict[str, object], reason: str
) -> None:
    with pytest.raises(DeliveryRejected, match=reason):
        _verify(_delivery(**changes))


def test_verify_when_the_ack_answers_another_request_then_rejects() -> None:
    delivery = _delivery()
    other = replace(delivery.request, deadline=delivery.request.deadline + 60)
    stale = replace(delivery, ack=replace(delivery.ack, request_hash=other.struct_hash()))
    with pytest.raises(DeliveryRejected, match="ack answers another request"):
        _verify(stale)


def test_verify_when_amount_exceeds_the_acked_price_then_rejects() -> None:
    delivery = _delivery()
    cheap_ack = replace(delivery, ack=replace(delivery.ack, price=delivery.receipt.amount - 1))
    with pytest.raises(DeliveryRejected, match="exceeds the acked price"):
        _verify(cheap_ack)


def test_verify_when_output_bytes_altered_then_rejects() -> None:
    delivery = _delivery()
    with pytest.raises(DeliveryRejected, match="output bytes"):
        _verify(replace(delivery, output=b"result-bytez"))


def test_verify_when_signed_by_someone_else_then_rejects() -> None:
    delivery = _delivery()
    forged = replace(delivery, receipt_signature=delivery.receipt.sign(DOMAIN, "0x" + "22" * 32))
    with pytest.raises(DeliveryRejected, match="signature"):
        _verify(forged)


def test_verify_when_amount_exceeds_request_maximum_then_rejects() -> None:
    delivery = _delivery()
    cheap = replace(delivery, request=replace(delivery.request, max_price=10))
    with pytest.raises(DeliveryRejected):
        _verify(cheap)


def test_check_chain_accepts_linked_receipts_and_rejects_gaps() -> None:
    first = _delivery(0).receipt
    second = replace(_delivery(1).receipt, prev_receipt_hash=first.struct_hash())
    check_chain([first, second])
    with pytest.raises(DeliveryRejected, match="chain"):
        check_chain([second])


def test_voucher_book_pays_cumulatively_and_never_past_cap() -> None:
    warnings: list[str] = []
    book = VoucherBook(deal_id=7, cap=1_500, on_warning=warnings.append)
    book.add(replace(_delivery(0).receipt, amount=600))
    first, sig = book.sign_next(DOMAIN, "0x" + "33" * 32)
    assert (first.cumulative_amount, first.covers(0), first.covers(1)) == (600, True, False)
    assert first.recover(DOMAIN, sig) == address_of("0x" + "33" * 32)
    book.add(replace(_delivery(1).receipt, amount=700))
    assert warnings and "87%" in warnings[0]
    second = book.next_voucher()
    assert (second.cumulative_amount, second.covers(0), second.covers(1)) == (1_300, True, True)
    with pytest.raises(SpendingCapExceeded):
        book.add(replace(_delivery(2).receipt, amount=201))
    assert book.total == 1_300


def test_voucher_book_never_vouches_claimed_or_repeated_tasks() -> None:
    book = VoucherBook(deal_id=7, cap=10_000)
    book.mark_claimed(3)
    with pytest.raises(ClientError, match="already paid or claimed"):
        book.add(_delivery(3).receipt)
    book.add(_delivery(0).receipt)
    with pytest.raises(ClientError):
        book.add(_delivery(0).receipt)
    book.sign_next(DOMAIN, "0x" + "33" * 32)
    with pytest.raises(ClientError, match="nothing new"):
        book.next_voucher()


def test_voucher_book_when_a_vouched_task_is_claimed_on_chain_then_the_next_voucher_drops_it() -> (
    None
):
    book = VoucherBook(deal_id=7, cap=10_000)
    first, second = _delivery(0).receipt, _delivery(1).receipt
    book.add(first)
    book.add(second)
    signed, _ = book.sign_next(DOMAIN, "0x" + "33" * 32)
    assert signed.covers(0) and signed.covers(1)
    book.mark_claimed(1)  # the provider claimed it instead of redeeming the voucher
    assert book.has_news() and book.paid == {0: first.amount}
    again = book.next_voucher()
    assert (again.covers(0), again.covers(1), again.cumulative_amount) == (
        True,
        False,
        first.amount,
    )
    assert not book.has_news(floor=first.amount)  # the chain redeemed that much already
