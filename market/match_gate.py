"""What may trade in one group commit: the funds check's gate for the matching engine
(`market.engine.gate.Gate`). The rules, and why a bid owner's balance is taken as it is, are
`market.funds`'s module docstring; the figures come from its `FundsGuard`."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from market.funds import FundsGuard


class MatchGate:
    """What may trade in one group commit (see the module): budgets and liveness, each found
    once per owner and kept for the group, whose fills are not counted yet. A bid owner's
    balance is the one kept in memory when the chain head is the block it is exact at (a head
    read at most `head_max_age_s` old), else the one the gate read at this head, else read
    afresh."""

    def __init__(self, guard: FundsGuard, now: int) -> None:
        """Answer for orders matched at `now`."""
        self._guard = guard
        self._now = now
        self._budgets: dict[str, int] = {}
        self._live: dict[str, bool] = {}
        self._head: int | None = None
        self._confirmed: bool | None = None

    def ask_live(self, owner: str) -> bool:
        """Return whether `owner`'s provider heartbeated within its TTL."""
        live = self._live.get(owner)
        if live is None:
            live = self._live[owner] = self._guard.provider_live(owner, self._now)
        return live

    def bid_units(self, owner: str, price: int, units: int) -> int:
        """Return how many of `units` at `price` `owner`'s free escrow balance still covers
        (after its unopened deals and this group's fills), and count them as spent."""
        budget = self._budgets.get(owner)
        if budget is None:
            guard = self._guard
            if self._confirmed is None:  # one head per group, read at most that old
                self._head = guard.head_now()
                self._confirmed = self._head is not None and self._head == guard.confirmed_block
            kept = guard.balances.cached(owner) if self._confirmed else None
            balance = guard.balance_at(owner, self._head) if kept is None else kept
            budget = balance - guard.unopened_spend(owner, self._now)
        take = max(0, min(units, budget // price))
        self._budgets[owner] = budget - take * price
        return take
