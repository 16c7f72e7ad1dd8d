"""Fair use of an HTTP service by client address: who the client is, and what it may hold.

Shared by the market and the provider daemon (their protocol, `services.serving`):

- **The client address.** The peer of the TCP connection, unless that peer is a configured
  reverse proxy (`TrustedProxies`, empty by default): then the right-most address of
  ``X-Forwarded-For`` that is not itself a trusted proxy. A header from anyone else is ignored,
  so a client cannot pose as another address by sending one.
- **Connections** (`ConnectionBudget`): at most ``max_per_address`` open connections from one
  client address (a trusted proxy's own connections count only in the total) and
  ``max_total`` in all; a connection beyond is answered at once, 429 (its address is over its
  share) or 503 (the service is full), with ``Retry-After``, and closed. One address holding
  many slow connections then cannot take the slots a normal client needs.
- **Requests** (`RequestBudget`): a token bucket per client address.
- **The Host header** (`host_allowed`): a service bound to a loopback address answers only
  requests whose ``Host`` is an IP literal, a name without a dot (``localhost``), a
  ``.localhost`` name or a configured name: a web page whose own (dotted) DNS name its author
  points at 127.0.0.1 (DNS rebinding) is refused.
"""

from __future__ import annotations

import ipaddress
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

LOOPBACK_NAMES = frozenset({"localhost", "localhost.localdomain", "ip6-localhost"})
MAX_TRACKED = 100_000
"""Request buckets kept at most (the fullest, oldest forgotten first when over)."""


class TrustedProxies:
    """The reverse proxies whose ``X-Forwarded-For`` names the client (addresses or networks)."""

    def __init__(self, entries: Iterable[str] = ()) -> None:
        """Parse ``entries`` (``10.0.0.1``, ``10.0.0.0/8``, ``::1``); raise ValueError if bad."""
        self.networks = tuple(ipaddress.ip_network(e.strip(), strict=False) for e in entries)

    def __bool__(self) -> bool:
        """Return whether any proxy is trusted."""
        return bool(self.networks)

    def __contains__(self, address: object) -> bool:
        """Return whether ``address`` is a trusted proxy."""
        if not self.networks or not isinstance(address, str):
            return False
        try:
            ip = ipaddress.ip_address(address)
        except ValueError:
            return False
        return any(ip in network for network in self.networks)

    def client(self, peer: str, forwarded: str | None) -> str:
        """Return the client's address: ``peer``, or what a trusted ``peer`` forwarded."""
        if not forwarded or peer not in self:
            return peer
        for hop in reversed([h.strip() for h in forwarded[:4096].split(",")]):
            try:
                address = str(ipaddress.ip_address(hop))
            except ValueError:
                return peer  # a hop no proxy wrote: the nearest trusted proxy is the client
            if address not in self:
                return address
        return peer


@dataclass
class ConnectionBudget:
    """Open connections per client address and in all (one per server)."""

    max_total: int
    max_per_address: int
    trusted: TrustedProxies = field(default_factory=TrustedProxies)
    total: int = 0
    by_address: dict[str, int] = field(default_factory=dict)

    def admit(self, address: str) -> int | None:
        """Count a new connection from ``address``; return None, or the status refusing it
        (429: the address holds its share; 503: the service holds all it may)."""
        if self.total >= self.max_total:
            return 503
        held = self.by_address.get(address, 0)
        if address not in self.trusted and held >= self.max_per_address:
            return 429
        self.total += 1
        self.by_address[address] = held + 1
        return None

    def release(self, address: str) -> None:
        """Count a connection of ``address`` closed."""
        self.total -= 1
        left = self.by_address.pop(address, 1) - 1
        if left > 0:
            self.by_address[address] = left


class RequestBudget:
    """A token bucket of requests per client address (``rate`` 0: no limit)."""

    def __init__(self, rate: float, burst: float) -> None:
        """Refill ``rate`` tokens a second per address, up to ``burst``."""
        self.rate = rate
        self.burst = max(burst, 1.0)
        self._buckets: dict[str, tuple[float, float]] = {}

    def take(self, address: str, now: float | None = None) -> float:
        """Spend one token of ``address``; return 0, or the seconds until one is there."""
        if self.rate <= 0:
            return 0.0
        now = time.monotonic() if now is None else now
        tokens, since = self._buckets.get(address, (self.burst, now))
        tokens = min(self.burst, tokens + (now - since) * self.rate)
        if tokens < 1:
            self._buckets[address] = (tokens, now)
            return (1 - tokens) / self.rate
        if len(self._buckets) >= MAX_TRACKED and address not in self._buckets:
            self._forget(now)
        self._buckets[address] = (tokens - 1, now)
        return 0.0

    def _forget(self, now: float) -> None:
        """Drop the buckets that are full again (they hold no state worth keeping)."""
        full = [a for a, (t, s) in self._buckets.items() if t + (now - s) * self.rate >= self.burst]
        for address in full or list(self._buckets)[: len(self._buckets) // 2]:
            del self._buckets[address]


def is_loopback_bind(host: str) -> bool:
    """Return whether a service bound to ``host`` listens on loopback only."""
    if host.lower() in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def host_allowed(host_header: str | None, allowed: Iterable[str] = ()) -> bool:
    """Return whether a request's ``Host`` is one a DNS-rebinding page cannot send.

    Such a page's origin is a DNS name its author controls, so it has a dot: an IP literal, a
    name without a dot (``localhost``, a service name), a ``.localhost`` name or one in
    ``allowed`` (any port) pass, and every other dotted name is refused.
    """
    if not host_header:
        return False
    host = host_header.strip().lower()
    if host.startswith("["):  # [::1]:8700
        return "]" in host
    name = host.rsplit(":", 1)[0] if host.count(":") == 1 else host
    name = name.rstrip(".")
    if "." not in name or name.endswith(".localhost") or name in LOOPBACK_NAMES:
        return True
    if name in {a.strip().lower().rstrip(".") for a in allowed}:
        return True
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True
