"""What may trade beyond price and compatibility: the market's word on each order's owner.

The engine stays pure: whoever places an order may pass a `Gate`, and the engine asks it, just
before each fill, whether the ask's provider is live and how many units the bid's owner can pay
for. Without a gate every order that crosses and is compatible trades.
"""

from __future__ import annotations

from typing import Protocol


class Gate(Protocol):
    """Answers the engine asks while matching one incoming order."""

    def ask_live(self, owner: str) -> bool:
        """Return whether asks of `owner` may trade now (its provider is live)."""

    def bid_units(self, owner: str, price: int, units: int) -> int:
        """Return how many of `units` at `price` a bid of `owner` may buy now (0..`units`),
        and count them as spent: the engine fills exactly what this returns."""
