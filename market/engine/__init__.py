"""The market's matching engine: pure, deterministic, price-time priority per device class."""

from market.engine.book import PriceLevel
from market.engine.compatibility import compatible
from market.engine.engine import MatchingEngine
from market.engine.fills import Fill
from market.engine.lifecycle import (
    LIVE_STATES,
    TERMINAL_STATES,
    TRANSITIONS,
    OrderState,
    can_transition,
    check_transition,
)
from market.engine.orders import ORDER_FIELDS, Order, OrderRecord, Side
from market.engine.snapshot import SNAPSHOT_VERSION, OrderData, SnapshotData

__all__ = [
    "LIVE_STATES",
    "ORDER_FIELDS",
    "SNAPSHOT_VERSION",
    "TERMINAL_STATES",
    "TRANSITIONS",
    "Fill",
    "MatchingEngine",
    "Order",
    "OrderData",
    "OrderRecord",
    "OrderState",
    "PriceLevel",
    "Side",
    "SnapshotData",
    "can_transition",
    "check_transition",
    "compatible",
]
