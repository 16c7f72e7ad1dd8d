"""Prometheus metrics of one daemon, in their own registry (several daemons per test process)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

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

    def render(self) -> bytes:
        """Return the Prometheus text exposition of every metric."""
        return generate_latest(self.registry)
