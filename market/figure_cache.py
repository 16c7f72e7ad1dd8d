"""Escrow figures (free balances, stakes) by address, each kept for a time (`FigureCache`)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable


class FigureCache:
    """Escrow figures by address, each kept `ttl` seconds."""

    def __init__(self, read: Callable[[str], int], ttl: float) -> None:
        self._read = read
        self.ttl = ttl  # may change: a process that starts indexing keeps figures for good
        self._values: dict[str, tuple[int, float]] = {}
        self._lock = threading.Lock()
        self.raises = 0  # reads that found a figure higher than the one kept (or none kept)

    def get(self, address: str) -> tuple[int, bool]:
        """Return the figure of `address` and whether it was read now: the cached one if
        younger than the cache allows, else read from the escrow."""
        with self._lock:
            cached = self._values.get(address)
        if cached is not None and time.monotonic() - cached[1] <= self.ttl:
            return cached[0], False
        return self.read(address), True

    def fresh(self, address: str) -> int | None:
        """Return the figure of `address` if younger than the cache allows, else None."""
        with self._lock:
            cached = self._values.get(address)
        if cached is None or time.monotonic() - cached[1] > self.ttl:
            return None
        return cached[0]

    def cached(self, address: str) -> int | None:
        """Return the last figure read for `address`, however old, or None."""
        with self._lock:
            cached = self._values.get(address)
        return None if cached is None else cached[0]

    def at_least(self, address: str, need: int) -> int:
        """Return the figure of `address`, read afresh if the cached one is below `need`."""
        value, read = self.get(address)
        return value if read or value >= need else self.read(address)

    def clear(self) -> None:
        """Drop every figure: each is read afresh when next needed."""
        with self._lock:
            self._values.clear()

    def forget(self, address: str) -> None:
        """Drop the figure of `address`: the next `get` reads it afresh."""
        with self._lock:
            self._values.pop(address, None)

    def read(self, address: str) -> int:
        """Read the figure of `address` from the escrow and cache it."""
        value = self._read(address)
        with self._lock:
            before = self._values.get(address)
            if before is None or value > before[0]:
                self.raises += 1
            self._values[address] = (value, time.monotonic())
            if len(self._values) > 100_000:
                self._values.clear()
        return value
