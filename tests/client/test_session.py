"""A client deal session against a real provider daemon over HTTP, on a real escrow.

Requests carry the deadline the client signs (the deal's SLO plus two seconds), acks are
checked against them, and the client pays exactly the verified deliveries: altered output bytes
and a late delivery are caught by verification and never paid; both are refunded on chain with
the penalty once their settlement instant has passed, after the provider is asked once more.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from dataclasses import replace

import pytest

from client.accounts import ClientAccount
from client.deal_refunds import refund_breaches
from client.errors import DeliveryRejected
from client.provider_http import ProviderHttp, TaskView
from client.session import DealSession
from client.tasks import TaskSpec, settle_by
from client.vouchers import VoucherBook
from contracts.messages import KIND_COMPILE, KIND_INFERENCE, Plan
from programs.envelope import ProgramEnvelope
from tests.e2e.stack import UNIT, Provider, Stack, spin_inputs, spin_model, stack, wait_until
from tests.polling import hang_ceiling_s

PLAN = Plan(compile_price=2_000, inference_price=1_000)
SLO_MS = 2_000
LATE_STEPS = 300_000_000  # about 6 s of device time: past the 2 s SLO plus 2 s of slack


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Stack, Provider]]:
    with stack(tmp_path_factory.mktemp("session"), lean=True) as built:
        provider = built.start_provider("prompt", PLAN, slo_ms=SLO_MS)
        built.escrow.deposit(built.client, UNIT)
        yield built, provider


def _envelope(steps: int, seed: int) -> ProgramEnvelope:
    model = spin_model()
    inputs = spin_inputs(model, steps, seed)
    return model.envelope(*(inputs[s.key] for s in model.signature.inputs))


class AlteringProvider(ProviderHttp):
    """A provider connection that flips a byte of every delivered output of one task."""

    def __init__(self, base_url: str, task_index: int, client_key: str) -> None:
        super().__init__(base_url, client_key=client_key)
        self.task_index = task_index

    def fetch(self, deal_id: int, task_index: int, *, wait_s: float = 0) -> TaskView:
        view = super().fetch(deal_id, task_index, wait_s=wait_s)
        if task_index == self.task_index and view.outputs:
            flipped = bytes([view.outputs[-1] ^ 1])
            view = replace(view, outputs=view.outputs[:-1] + flipped)
        return view


def _session(st: Stack, provider: ProviderHttp, address: str, deal_id: int) -> DealSession:
    account = ClientAccount(st.escrow, st.token, st.client, min_challenge_window=10)
    deal = st.escrow.get_deal(deal_id)
    return DealSession(
        provider=provider,
        account=account,
        domain=st.escrow.domain,
        deal_id=deal_id,
        plan=PLAN,
        provider_address=address,
        book=VoucherBook(deal_id=deal_id, cap=deal.max_spend),
        challenge_window=deal.challenge_window,
        spot_check_fraction=1.0,
    )


def test_session_pays_verified_work_and_refunds_what_was_late_or_wrong(
    world: tuple[Stack, Provider],
) -> None:
    st, provider = world
    # A window long enough that the daemon does not claim before the test moves the chain.
    deal_id = st.open_deal(st.quote(provider, max_spend=100_000, window=60), provider)
    connection = AlteringProvider(provider.url, task_index=2, client_key=st.client)
    session = _session(st, connection, provider.address, deal_id)
    specs = [TaskSpec(KIND_INFERENCE, _envelope(1_000, seed), 10_000) for seed in range(4)]
    specs.append(TaskSpec(KIND_COMPILE, _envelope(1_000, 9), 10_000, target="local"))
    sent_at = time.time()
    outcomes = session.run(specs, concurrency=2, wait_s=hang_ceiling_s(30))
    for outcome in outcomes:  # the deadline the client signed: now + ceil(SLO) + 2 s
        assert outcome.request.deadline - int(sent_at) in range(
            math.ceil(SLO_MS / 1000) + 2, math.ceil(SLO_MS / 1000) + 2 + int(hang_ceiling_s(30))
        )
        assert outcome.ack is not None and outcome.ack.request_hash == outcome.request.struct_hash()
    assert [o.verified for o in outcomes] == [True, True, False, True, True]
    assert "output bytes" in (outcomes[2].rejected or "")
    assert all(o.spot_checked for o in outcomes if o.verified and o.spec.kind == KIND_INFERENCE)

    voucher = session.pay()
    assert voucher is not None
    assert voucher.cumulative_amount == 3 * PLAN.inference_price + PLAN.compile_price
    assert [voucher.covers(i) for i in range(6)] == [True, True, False, True, True, False]
    wait_until(
        lambda: st.escrow.get_deal(deal_id).vouched == voucher.cumulative_amount,
        60,
        "the provider redeeming the voucher",
    )

    late = session.submit(TaskSpec(KIND_INFERENCE, _envelope(LATE_STEPS, 5), 10_000))
    session.await_delivery(late, wait_s=hang_ceiling_s(30))
    wait_until(
        lambda: (
            session.collect(late, wait_s=5).view is not None
            and late.view is not None
            and late.view.receipt is not None
        ),
        120,
        "the late delivery",
    )
    assert not late.verified and "after the deadline" in (late.rejected or "")

    deal = st.escrow.get_deal(deal_id)
    due = settle_by(late.request.deadline, deal.expiry, deal.challenge_window)
    assert refund_breaches(session, st.anvil.latest_timestamp()) == []  # not before settleBy
    st.anvil.increase_time(due + 1 - st.anvil.latest_timestamp())
    refunded = refund_breaches(session, st.anvil.latest_timestamp())
    assert [o.index for o in refunded] == [2, 5]  # asked once more: still wrong, still late
    after = st.escrow.get_deal(deal_id)
    assert after.stake == UNIT - 2 * 50_000
    assert [o.refunded for o in refunded] == [(PLAN.inference_price, 50_000)] * 2
    assert after.committed == voucher.cumulative_amount + 2 * PLAN.inference_price


def test_session_refuses_an_ack_that_answers_another_request(
    world: tuple[Stack, Provider],
) -> None:
    st, provider = world
    deal_id = st.open_deal(st.quote(provider, max_spend=100_000), provider)
    connection = ProviderHttp(provider.url, client_key=st.client)
    session = _session(st, connection, provider.address, deal_id)
    outcome = session.submit(TaskSpec(KIND_INFERENCE, _envelope(1_000, 1), 10_000))
    assert outcome.ack is not None
    other = replace(outcome.request, deadline=outcome.request.deadline + 600)
    with pytest.raises(DeliveryRejected, match="ack is for another request"):
        session.check_ack(other, outcome.ack, outcome.ack_signature)
    dear = replace(outcome.ack, price=outcome.request.max_price + 1)
    with pytest.raises(DeliveryRejected, match="ack price above"):
        session.check_ack(outcome.request, dear, dear.sign(st.escrow.domain, provider.key))
    forged = outcome.ack.sign(st.escrow.domain, st.client)
    with pytest.raises(DeliveryRejected, match="ack signature"):
        session.check_ack(outcome.request, outcome.ack, forged)
