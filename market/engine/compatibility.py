"""The one rule deciding whether an ask can serve a bid, price aside."""

from __future__ import annotations

from market.engine.orders import Order


def compatible(bid: Order, ask: Order) -> bool:
    """Return whether `ask` meets `bid`'s constraints: same plan, SLO and memory that fit.

    The ask's offered latency must be no worse than the bid requires (`ask.slo_ms <=
    bid.slo_ms`) and its offered memory no less than the bid needs. Device class is not checked
    here: each device class has its own book.
    """
    return ask.slo_ms <= bid.slo_ms and ask.memory >= bid.memory and ask.plan == bid.plan
