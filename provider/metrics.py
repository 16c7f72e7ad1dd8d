"""Prometheus metrics of one daemon, in their own registry (several daemons per test process).

Money counters (``tpumarket_provider_money_events_total``, ``..._money_amount_total``,
``..._paid_amount_total``, ``..._settlements_total``) are recomputed from the journal's
settlement records when the daemon starts (:meth:`ProviderMetrics.restore`), so they survive
restarts; the task counters count this process's life only.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Final

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from provider.lifecycle import SettlementAction, SettlementEvent

MONEY_AMOUNTS: Final[dict[str, tuple[tuple[str, str], ...]]] = {
    SettlementAction.REDEEM: (("paid", "paid"),),
    SettlementAction.CLAIM: (("amount", "claimed"),),
    SettlementAction.FINALIZE: (("amount", "paid"),),
    SettlementAction.REJECTED: (("amount", "lost"),),
    SettlementAction.REFUNDED: (("refund", "refunded"), ("penalty", "penalty")),
    SettlementAction.CLOSED: (
        ("returned_to_client", "returned_to_client"),
        ("stake_returned", "stake_returned"),
    ),
}
"""Per journaled settlement action: (data field, ``what`` label) of the amounts it moved.

The other money event, :attr:`SettlementEvent.DISPUTED`, moves nothing when it happens."""

_LATENCY_BUCKETS = (0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 120)


class ProviderMetrics:
    """Counters and histograms the daemon updates; :meth:`render` is the /metrics body."""

    def __init__(self) -> None:
        """Create every metric in a fresh registry."""
        self.registry = CollectorRegistry()
        r = self.registry
        self.tasks_acked = Counter(
            "tpumarket_provider_tasks_acked",
            "Tasks accepted with a signed ack",
            ["kind"],
            registry=r,
        )
        self.tasks_rejected = Counter(
            "tpumarket_provider_tasks_rejected", "Task submissions refused", ["reason"], registry=r
        )
        self.tasks_retried = Counter(
            "tpumarket_provider_tasks_idempotent_retries",
            "Resubmissions answered with the existing ack",
            registry=r,
        )
        self.tasks_delivered = Counter(
            "tpumarket_provider_tasks_delivered", "Receipts signed", ["kind", "state"], registry=r
        )
        self.task_seconds = Histogram(
            "tpumarket_provider_task_seconds",
            "Ack to receipt, seconds",
            ["kind"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.amount_receipted = Counter(
            "tpumarket_provider_receipted_amount", "Sum of receipt amounts (base units)", registry=r
        )
        self.vouchers = Counter(
            "tpumarket_provider_vouchers", "Vouchers posted", ["result"], registry=r
        )
        self.settlements = Counter(
            "tpumarket_provider_settlements", "On-chain settlement steps", ["action"], registry=r
        )
        self.settlement_failures = Counter(
            "tpumarket_provider_settlement_failures",
            "Settlement transactions that failed",
            ["action"],
            registry=r,
        )
        self.paid = Counter(
            "tpumarket_provider_paid_amount", "Amount paid on chain (base units)", registry=r
        )
        self.inflight = Gauge(
            "tpumarket_provider_tasks_inflight", "Acked tasks not yet delivered", registry=r
        )
        self.quotes = Counter(
            "tpumarket_provider_quotes",
            "Per-fill quotes for the market's deals, by outcome",
            ["result"],
            registry=r,
        )
        self.asks = Counter(
            "tpumarket_provider_asks",
            "Asks posted to the market, by outcome",
            ["result"],
            registry=r,
        )
        self.heartbeats = Counter(
            "tpumarket_provider_heartbeats", "Adverts sent to the market", ["result"], registry=r
        )

        self.money_events = Counter(
            "tpumarket_provider_money_events",
            "Money events of this provider's deals (redeem, claim, finalize, rejected, "
            "refunded, disputed, closed)",
            ["event"],
            registry=r,
        )
        self.money_amount = Counter(
            "tpumarket_provider_money_amount",
            "Base units moved by money events, by event and what (paid, claimed, lost, "
            "refunded, penalty, returned_to_client, stake_returned)",
            ["event", "what"],
            registry=r,
        )
        self.chain_stalls = Counter(
            "tpumarket_provider_chain_stalls",
            "Settlement passes still running when the next was due (a slow or stalled chain)",
            registry=r,
        )
        self.settlement_pass_seconds = Gauge(
            "tpumarket_provider_settlement_pass_seconds",
            "Duration of the last finished settlement pass",
            registry=r,
        )

    def money(self, action: str, data: Mapping[str, Any]) -> None:
        """Count one money event and the amounts it moved: a journaled settlement action (a
        :class:`SettlementAction` or its string) or :attr:`SettlementEvent.DISPUTED`."""
        fields = MONEY_AMOUNTS.get(action)
        if fields is None and action != SettlementEvent.DISPUTED:
            return
        self.money_events.labels(action).inc()
        for name, what in fields or ():
            amount = int(data.get(name) or 0)
            if amount:
                self.money_amount.labels(action, what).inc(amount)
                if what == "paid":
                    self.paid.inc(amount)

    def restore(self, settlements: Iterable[tuple[str, Mapping[str, Any]]]) -> None:
        """Recount the journal's settlement records (action, data), oldest first, at start."""
        for action, data in settlements:
            self.settlements.labels(action).inc()
            self.money(action, data)

    def render(self) -> bytes:
        """Return the Prometheus text exposition of every metric."""
        return generate_latest(self.registry)
