"""Order builders for the market tests: sensible defaults, override what the test is about."""

from __future__ import annotations

from market.engine import Order, Side

GIB = 1 << 30
NOW = 1_000
FAR = 1_000_000


def order(side: Side, order_id: str, /, **overrides: object) -> Order:
    """Return an order with defaults that trade with each other, fields overridden as given."""
    fields: dict[str, object] = {
        "side": side,
        "order_id": order_id,
        "owner": "0x" + "ab" * 20,
        "device_class": "tpu-v5e",
        "quantity": 10,
        "price": 100,
        "plan": "metered",
        "slo_ms": 100,
        "memory": 16 * GIB,
        "expiry": FAR,
    }
    fields.update(overrides)
    return Order(**fields)  # type: ignore[arg-type]


def bid(order_id: str, /, **overrides: object) -> Order:
    """Return a bid (needs 16 GiB, requires 100 ms) with overrides."""
    return order(Side.BID, order_id, **overrides)


def ask(order_id: str, /, **overrides: object) -> Order:
    """Return an ask (offers 16 GiB, 100 ms) with overrides."""
    return order(Side.ASK, order_id, **overrides)
