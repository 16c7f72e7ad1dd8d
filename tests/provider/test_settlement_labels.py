"""The settlement's lifecycle enums write exactly the strings journals, JSON and metrics hold."""

from __future__ import annotations

import json

from provider.diagnosis import Category, diagnose
from provider.lifecycle import SettlementAction, SettlementEvent, SettlementStep, TaskState
from provider.metrics import MONEY_AMOUNTS, ProviderMetrics
from provider.receipts import delivery
from provider.sandbox.results import InferenceResult, TaskFailure


def without_created(rendered: bytes) -> str:
    """Return the exposition without its ``_created`` samples (each metric's creation time)."""
    lines = rendered.decode().splitlines()
    return "\n".join(line for line in lines if "_created" not in line)


def test_steps_and_events_are_the_metric_label_strings() -> None:
    assert [s.value for s in SettlementStep] == [
        "discover",
        "watch",
        "reconcile",
        "redeem",
        "claim",
        "finalize",
        "lapse",
        "close",
    ]
    assert [e.value for e in SettlementEvent] == ["reconciled", "disputed"]
    assert f"{SettlementStep.LAPSE} failed" == "lapse failed"


def test_money_amounts_cover_every_money_moving_action_by_its_string() -> None:
    assert set(MONEY_AMOUNTS) == {"redeem", "claim", "finalize", "rejected", "refunded", "closed"}
    assert all(type(action) is SettlementAction for action in MONEY_AMOUNTS)


def test_metrics_when_counted_by_member_then_render_as_counted_by_string() -> None:
    events = [
        ("redeem", {"paid": "70"}),
        ("claim", {"amount": "30"}),
        ("finalize", {"amount": "30"}),
        ("refunded", {"refund": "5", "penalty": "2"}),
        ("closed", {"returned_to_client": "9", "stake_returned": "4"}),
        ("opened", {"max_spend": "100"}),
    ]
    by_string, by_member = ProviderMetrics(), ProviderMetrics()
    by_string.restore(events)
    by_string.money("disputed", {})
    by_string.settlement_failures.labels("lapse").inc()
    by_string.settlements.labels("reconciled").inc()
    by_member.restore((SettlementAction(action), data) for action, data in events)
    by_member.money(SettlementEvent.DISPUTED, {})
    by_member.settlement_failures.labels(SettlementStep.LAPSE).inc()
    by_member.settlements.labels(SettlementEvent.RECONCILED).inc()

    text = without_created(by_member.render())
    assert text == without_created(by_string.render())
    assert 'tpumarket_provider_money_events_total{event="disputed"} 1.0' in text
    assert "tpumarket_provider_paid_amount_total 100.0" in text
    assert 'tpumarket_provider_settlement_failures_total{action="lapse"} 1.0' in text
    assert 'tpumarket_provider_settlements_total{action="reconciled"} 1.0' in text
    assert 'event="opened"' not in text  # an action that moves no money is no money event


def test_delivery_detail_when_serialized_then_state_is_the_plain_string() -> None:
    success = InferenceResult(
        program_sha256=b"p",
        inputs_sha256=b"i",
        outputs=b"o",
        outputs_sha256=b"h",
        device_time_s=0.002,
        compile_time_s=0.0,
        cache_hit=False,
        platform="cpu",
        device_kind="cpu",
    )
    failure = TaskFailure(
        diagnosis=diagnose(Category.OOM, "out of memory"), program_sha256=None, elapsed_s=0.1
    )
    succeeded = delivery(success)[1]
    failed = delivery(failure)[1]
    assert succeeded["state"] is TaskState.SUCCEEDED and failed["state"] is TaskState.FAILED
    assert json.dumps(succeeded, sort_keys=True) == (
        '{"device_kind": "cpu", "platform": "cpu", "state": "succeeded"}'
    )
    assert json.dumps(failed).startswith('{"state": "failed", "diagnosis": {"category": "oom"')
