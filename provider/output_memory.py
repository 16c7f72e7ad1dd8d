"""Delivered outputs kept in memory for the answers that follow, within a byte budget."""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from collections.abc import Iterable

from provider.errors import ConfigError
from provider.journal import Key

OUTPUT_MEMORY_BYTES = 256 * 1024 * 1024
"""The default byte budget of delivered outputs kept in memory (see :class:`OutputMemory`)."""
OUTPUT_MEMORY_ENV = "TPUMARKET_PROVIDER_OUTPUT_MEMORY_BYTES"
"""Environment variable that sets the budget in bytes (0 keeps none in memory)."""


class OutputMemory:
    """Delivered outputs kept in memory for the answers that follow, within a byte budget.

    Every delivered output is journaled (on disk, in the data dir) with its receipt until the
    task is settled (then pruned, and dropped here too: :meth:`discard`); this keeps
    the most recent ones in memory so the answer to ``wait=`` and the first fetch skip the
    journal. Oldest first out once the budget (or ``max_items``) is full; an output larger than
    a quarter of the budget is never kept (it is read back from the journal). Thread-safe.
    """

    def __init__(self, budget_bytes: int, max_items: int = 4096) -> None:
        """Keep at most ``budget_bytes`` of outputs (0: none) of at most ``max_items`` tasks."""
        if budget_bytes < 0:
            raise ValueError(f"the output memory budget must be >= 0, got {budget_bytes}")
        self.budget_bytes = budget_bytes
        self.max_items = max_items
        self.held_bytes = 0
        self.evicted = 0
        self.not_kept = 0
        self._items: OrderedDict[Key, bytes] = OrderedDict()
        self._lock = threading.Lock()

    def put(self, key: Key, outputs: bytes) -> bool:
        """Keep ``outputs`` of task ``key`` if they fit; return whether they are kept."""
        size = len(outputs)
        with self._lock:
            if size * 4 > self.budget_bytes:
                self.not_kept += 1
                return False
            old = self._items.pop(key, None)
            self.held_bytes -= 0 if old is None else len(old)
            self._items[key] = outputs
            self.held_bytes += size
            while self.held_bytes > self.budget_bytes or len(self._items) > self.max_items:
                _, dropped = self._items.popitem(last=False)
                self.held_bytes -= len(dropped)
                self.evicted += 1
            return True

    def discard(self, deal_id: int, indexes: Iterable[int]) -> None:
        """Drop the outputs of a deal's tasks (pruned from the journal once settled)."""
        with self._lock:
            for index in indexes:
                dropped = self._items.pop((deal_id, index), None)
                if dropped is not None:
                    self.held_bytes -= len(dropped)

    def get(self, key: Key) -> bytes | None:
        """Return the outputs of task ``key`` if they are in memory."""
        with self._lock:
            return self._items.get(key)

    def __len__(self) -> int:
        """Return how many outputs are in memory."""
        return len(self._items)


def output_memory_budget(default: int = OUTPUT_MEMORY_BYTES) -> int:
    """Return the output memory budget: :data:`OUTPUT_MEMORY_ENV` when set, else ``default``."""
    text = os.environ.get(OUTPUT_MEMORY_ENV, "").strip()
    if not text:
        return default
    try:
        budget = int(text)
    except ValueError as exc:
        raise ConfigError(f"{OUTPUT_MEMORY_ENV} must be a number of bytes, got {text!r}") from exc
    if budget < 0:
        raise ConfigError(f"{OUTPUT_MEMORY_ENV} must be >= 0, got {budget}")
    return budget


__all__ = ["OUTPUT_MEMORY_BYTES", "OUTPUT_MEMORY_ENV", "OutputMemory", "output_memory_budget"]
