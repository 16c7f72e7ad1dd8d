"""The market's Prometheus metrics (served at `/metrics`)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from market.engine import MatchingEngine, Side
from market.placement import Placed


class Metrics:
    """The Prometheus metrics of one market service."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.orders = Counter(
            "market_orders_accepted_total",
            "Orders accepted",
            ["side", "device_class"],
            registry=registry,
        )
        self.rejected = Counter(
            "market_orders_rejected_total", "Orders rejected", ["reason"], registry=registry
        )
        self.fills = Counter("market_fills_total", "Fills", ["device_class"], registry=registry)
        self.volume = Counter(
            "market_fill_units_total", "Units traded", ["device_class"], registry=registry
        )
        self.place_seconds = Histogram(
            "market_place_seconds",
            "Time to verify, match and commit one placement request",
            registry=registry,
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0),
        )
        self.group_orders = Histogram(
            "market_commit_group_orders",
            "Orders in one group commit of the writer (every request it found waiting)",
            registry=registry,
            buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256, 1000),
        )
        self.live_orders = Gauge(
            "market_live_orders", "Orders resting in the book", ["device_class"], registry=registry
        )
        self.providers_online = Gauge(
            "market_providers_online", "Providers with a recent heartbeat", registry=registry
        )
        self.indexed_block = Gauge(
            "market_indexed_block", "Last escrow block indexed", registry=registry
        )
        self.heap_frozen = Gauge(
            "market_heap_frozen_objects",
            "Objects built at start-up, kept out of the garbage collector's scans",
            registry=registry,
        )
        self.indexer_errors = Counter(
            "market_indexer_errors_total", "Indexer runs that failed", registry=registry
        )
        self.expired = Counter("market_orders_expired_total", "Orders expired", registry=registry)
        self.rematched = Counter(
            "market_rematch_fills_total",
            "Fills of resting orders matched again once the match gate let them trade",
            registry=registry,
        )

    def count_committed(self, results: list[list[Placed]]) -> None:
        """Count a committed group's orders and fills, and its size."""
        orders: dict[tuple[str, str], int] = {}
        fills: dict[str, tuple[int, int]] = {}
        for placed in results:
            for p in placed:
                order = p.checked.order
                key = (order.side.value, order.device_class)
                orders[key] = orders.get(key, 0) + 1
                for f in p.fills:
                    count, units = fills.get(f.device_class, (0, 0))
                    fills[f.device_class] = (count + 1, units + f.quantity)
        self.group_orders.observe(sum(orders.values()))
        for (side, name), count in orders.items():
            self.orders.labels(side, name).inc(count)
        for name, (count, units) in fills.items():
            self.fills.labels(name).inc(count)
            self.volume.labels(name).inc(units)

    def set_live(self, name: str, engine: MatchingEngine) -> None:
        """Set the live-orders gauge of one class (call with the class's lock held)."""
        live = sum(
            level.orders for side in (Side.BID, Side.ASK) for level in engine.depth(name, side)
        )
        self.live_orders.labels(name).set(live)
