"""Attack 10 of ``scripts/abuse``: one address holds more slow connections than either service
may hold in all, while a normal client calls both.

The attacker (source 127.0.0.9) opens connections to the market and to the daemon, each
sending a request whose headers never end, beyond the service's whole connection limit (4,096
and 1,024 by default; a share of it in ``--quick``). Meanwhile a normal client (its own
address) calls each service; ``normal_refused_under_connection_flood`` counts its calls that
failed. The connections the services refused at once (429 with ``Retry-After``, past the
address's share) are counted too.
"""

from __future__ import annotations

import contextlib
import socket
from typing import Any
from urllib.parse import urlsplit

import httpx

from scripts.abuse_attacks import Tally
from scripts.abuse_world import World

ATTACKER = "127.0.0.9"


def _hold(url: str, count: int) -> list[socket.socket]:
    """Open up to ``count`` connections from the attacker's address, each mid-request."""
    parts = urlsplit(url)
    held = []
    for _ in range(count):
        try:
            sock = socket.create_connection(
                (parts.hostname or "127.0.0.1", parts.port or 80),
                timeout=5,
                source_address=(ATTACKER, 0),
            )
            sock.sendall(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        except OSError:
            break  # out of ports or descriptors: the flood is as large as it gets
        held.append(sock)
    return held


def _refused(socks: list[socket.socket]) -> int:
    """Return how many of ``socks`` the server answered 429 and closed."""
    count = 0
    for sock in socks:
        sock.settimeout(0.05)
        with contextlib.suppress(OSError):
            if sock.recv(64).startswith(b"HTTP/1.1 429"):
                count += 1
    return count


def connection_flood(world: World, tally: Tally, quick: bool) -> dict[str, Any]:
    """Flood both services from one address; return the normal client's failures."""
    sizes = {"market": 600 if quick else 4_200, "daemon": 600 if quick else 1_100}
    targets = {"market": (world.market, "/healthz"), "daemon": (world.daemon, "/v1/health")}
    figures: dict[str, Any] = {"held": {}, "refused_429": {}, "normal_calls": 0}
    failed = 0
    for name, (url, path) in targets.items():
        socks = _hold(url, sizes[name])
        try:
            with httpx.Client(base_url=url, timeout=30) as normal:
                for _ in range(20):
                    figures["normal_calls"] += 1
                    try:
                        reply = normal.get(path)
                    except httpx.HTTPError:
                        failed += 1
                        continue
                    tally.scan(reply, f"flood: normal call to the {name}")
                    failed += reply.status_code != 200
            figures["held"][name] = len(socks)
            figures["refused_429"][name] = _refused(socks)
        finally:
            for sock in socks:
                sock.close()
    tally.normal_refused_under_flood += failed
    figures["normal_refused"] = failed
    return figures
