"""The soak's auditor finds what goes wrong: a settlement read back from a real chain.

One anvil and escrow; a provider's journal (the daemon's own `provider.journal.Journal`)
records eight acked tasks of one deal with real signatures, and the chain settles them by
hand (vouchers, a claim finalized, a claim disputed and ruled for the client, refunds), some
of them wrongly: a task delivered on time and refunded instead of paid, one whose claim was
ruled against its provider, a breach never refunded, the same inputs vouched under two task
indexes. The auditor must count each.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from contracts.messages import (
    KIND_INFERENCE,
    ZERO_HASH,
    Ack,
    Claim,
    Quote,
    Receipt,
    TaskRequest,
    Voucher,
    address_of,
    task_bitmap,
)
from contracts.pricing import flat
from programs.envelope import encode_envelope
from provider.journal import AckRecord, Journal
from tests.e2e.audit import audit, read_journal
from tests.e2e.stack import MIN_WINDOW, PROVIDER_STAKE, UNIT, Stack, spin_model, stack

PLAN = flat(compile_price=3_000, inference_price=1_000)
PRICE = PLAN.inference_price
PENALTY = 7_000


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Stack, str, Path]]:
    work = tmp_path_factory.mktemp("audit")
    with stack(work) as st:
        provider = st.spare_keys.pop()
        st.token.mint(st.deployer, address_of(provider), PROVIDER_STAKE)
        st.token.approve(provider, st.escrow.address, PROVIDER_STAKE)
        st.escrow.stake(provider, PROVIDER_STAKE)
        st.escrow.deposit(st.client, UNIT)
        yield st, provider, work / "journal.sqlite3"


def test_audit_counts_paid_refunded_lost_paid_twice_and_both_sides_losses(
    world: tuple[Stack, str, Path],
) -> None:
    st, provider_key, path = world
    provider = address_of(provider_key)
    quote = Quote(
        provider=provider,
        client=address_of(st.client),
        arbiter=address_of(st.arbiter),
        max_spend=100_000,
        stake=UNIT,
        penalty=PENALTY,
        duration=3_600,
        challenge_window=MIN_WINDOW,
        slo_ms=1_000,
        valid_until=st.anvil.latest_timestamp() + 600,
        nonce=1,
        plan=PLAN,
    )
    opened = st.escrow.open_deal(
        st.client, quote, quote.sign(st.escrow.domain, provider_key), quote.max_spend
    )
    deal_id = int(opened.event("DealOpened").args["dealId"])
    domain = st.escrow.domain
    model = spin_model()
    envelope = model.envelope(np.array([10], np.int32), np.ones(4, np.float32))
    frame = encode_envelope(envelope)
    now = st.anvil.latest_timestamp()
    deadline = now + 5
    journal = Journal(path, provider, domain)
    requests: dict[int, TaskRequest] = {}
    acks: dict[int, tuple[Ack, bytes]] = {}
    inputs = [bytes([i]) * 32 for i in (1, 2, 3, 4, 5, 5, 6, 7)]
    for index, input_hash in enumerate(inputs):
        request = TaskRequest(
            deal_id=deal_id,
            task_index=index,
            kind=KIND_INFERENCE,
            program_hash=envelope.program_sha256,
            input_hash=input_hash,
            max_price=PRICE,
            deadline=deadline,
        )
        ack = Ack(deal_id, index, request.struct_hash(), PRICE)
        signature = ack.sign(domain, provider_key)
        requests[index], acks[index] = request, (ack, signature)
        journal.record_ack(
            AckRecord(
                request=request,
                request_sig=request.sign(domain, st.client),
                request_hash=request.struct_hash(),
                target=None,
                ack=ack,
                ack_sig=signature,
                acked_at=float(now),
            ),
            frame,
        )
    # Delivered on time: 0 (vouched), 1 (refunded: the provider's loss), 4 and 5 (same inputs),
    # 6 (claimed, finalized), 7 (claimed, disputed, ruled for the client: the provider's loss).
    receipts: dict[int, Receipt] = {}
    for index in (0, 1, 4, 5, 6, 7):
        request = requests[index]
        receipt = Receipt(
            deal_id=deal_id,
            task_index=index,
            kind=KIND_INFERENCE,
            status=0,
            cache_hit=False,
            device_ms=1,
            compile_ms=0,
            program_hash=request.program_hash,
            input_hash=request.input_hash,
            output_hash=ZERO_HASH,
            started_at=now,
            finished_at=now + 1,
            deadline=deadline,
            amount=PRICE,
            prev_receipt_hash=journal.next_prev_hash(deal_id),
        )
        journal.record_receipt(receipt, receipt.sign(domain, provider_key), b"", {})
        receipts[index] = receipt
    journal.close()

    voucher = Voucher(deal_id, 3 * PRICE, task_bitmap([0, 4, 5]))
    st.escrow.redeem_voucher(provider_key, voucher, voucher.sign(domain, st.client))
    for index in (6, 7):  # batches 0 and 1
        claim = Claim(receipts[index], PRICE, requests[index].sign(domain, st.client))
        st.escrow.claim_receipts(provider_key, deal_id, PLAN, [claim])
    st.escrow.dispute_claim(st.client, deal_id, 1)
    st.escrow.resolve_dispute(st.arbiter, deal_id, 1, False)
    st.anvil.increase_time(deadline + 2 * quote.challenge_window + 1 - now)
    st.escrow.finalize_claim(provider_key, deal_id, 0)
    for index in (1, 2):  # 1 was delivered on time: refunding it takes the provider's due
        ack, signature = acks[index]
        st.escrow.refund_breach(st.client, requests[index], ack, signature)
    # 3: never delivered and never refunded: lost, and the client's refund and penalty with it.

    assert set(read_journal(path)) == {(deal_id, i) for i in range(8)}
    result = audit(st.escrow, st.token, [path])
    assert result.tasks_acked == 8
    assert result.tasks_paid == 4  # 0, 4, 5 vouched; 6 claimed and finalized
    assert result.tasks_refunded == 3  # 1 and 2 refunded, 7 won in a dispute
    assert result.tasks_lost == 1
    assert result.tasks_paid_twice == 1  # the same inputs paid under indexes 4 and 5
    assert result.honest_provider_losses == 2 * (PRICE + PENALTY)  # tasks 1 and 7
    assert result.honest_client_losses == PRICE + PENALTY  # task 3
    assert result.invariant_ok is True
    assert result.details["lost"] == [[deal_id, 3]]
    assert result.details["inputs_acked"] == 7
    assert result.details["tasks_claimed"] == 2
    assert result.details["paid_to_providers"] == 4 * PRICE
    assert result.details["penalties_to_clients"] == 3 * PENALTY
