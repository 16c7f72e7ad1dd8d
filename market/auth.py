"""Authentication rules of the market: signed writes, nonces, rate limits.

No passwords: every write carries an EIP-712 signature by its owner under the market domain,
with a nonce used once per signer and an expiry. Rate limits are token buckets per signer
address and per client IP, in process (one market process serves one region).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from market.errors import (
    AuthError,
    ForbiddenError,
    RateLimitedError,
    ReplayError,
    SignatureExpiredError,
)

__all__ = [
    "AuthError",
    "ForbiddenError",
    "RateLimitedError",
    "ReplayError",
    "SignatureExpiredError",
]


class RateLimiter:
    """Token buckets by key: `rate` tokens per second, holding at most `burst`."""

    def __init__(
        self, *, rate: float, burst: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        """Create a limiter; `rate <= 0` disables it."""
        self.rate = rate
        self.burst = burst
        self._clock = clock
        self._buckets: dict[str, tuple[float, float]] = {}
        self._lock = threading.Lock()

    def take(self, key: str, cost: float = 1.0) -> None:
        """Spend `cost` tokens of `key`'s bucket; raise `RateLimitedError` if it lacks them."""
        if self.rate <= 0:
            return
        now = self._clock()
        with self._lock:
            tokens, last = self._buckets.get(key, (self.burst, now))
            tokens = min(self.burst, tokens + (now - last) * self.rate)
            if tokens < cost:
                self._buckets[key] = (tokens, now)
                raise RateLimitedError(key, (cost - tokens) / self.rate)
            self._buckets[key] = (tokens - cost, now)
            if len(self._buckets) > 100_000:
                self._forget_full(now)

    def _forget_full(self, now: float) -> None:
        full = [
            k
            for k, (tokens, last) in self._buckets.items()
            if tokens + (now - last) * self.rate >= self.burst
        ]
        for key in full:
            del self._buckets[key]
