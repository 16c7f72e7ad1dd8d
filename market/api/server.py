"""Serving the app with uvicorn on connections a slow or idle client cannot hold open.

The protocol (`services.serving.guarded_protocol`, shared with the provider daemon) closes a
new connection that sends nothing within the keep-alive timeout, a request that does not
arrive whole (request line, headers and body) within `request_read_timeout_s` of its first
byte (a 408 if its headers never completed), and headers over `max_header_bytes` (a 400).

Bodies are capped per route by the app (`market.api.body`), so a request's size and the time
it may take to arrive are both bounded.
"""

from __future__ import annotations

import json
from typing import Any

import uvicorn

from market.settings import Settings
from services.fairness import ConnectionBudget, TrustedProxies, is_loopback_bind
from services.serving import (
    REFUSAL_RETRY_S,
    GuardedHttpToolsProtocol,
    HostCheck,
    guarded_protocol,
    redact_logs,
)


def split(text: str) -> tuple[str, ...]:
    """Return the entries of a comma-separated setting."""
    return tuple(part.strip() for part in text.split(",") if part.strip())


def _error(status: int, error: str, detail: str) -> bytes:
    body = {"error": error, "detail": detail, "problems": []}  # `market.api.errors.ErrorPublic`
    return json.dumps(body).encode()


def market_protocol(settings: Settings) -> type[GuardedHttpToolsProtocol]:
    """Return the protocol class with the read timeout, header cap and connection budget (per
    client address and in all) of `settings`."""
    budget = ConnectionBudget(
        max_total=settings.max_connections,
        max_per_address=settings.max_connections_per_ip,
        trusted=TrustedProxies(split(settings.trusted_proxies)),
    )
    wait = f"retry after {REFUSAL_RETRY_S} s"
    refusals = {
        429: _error(
            429,
            "TooManyConnectionsError",
            f"at most {settings.max_connections_per_ip} open connections from one client "
            f"address; {wait}",
        ),
        503: _error(
            503, "OverloadedError", f"at most {settings.max_connections} open connections; {wait}"
        ),
    }
    return guarded_protocol(
        "MarketHttpProtocol",
        read_timeout=settings.request_read_timeout_s,
        max_header_bytes=settings.max_header_bytes,
        budget=budget,
        refusal_bodies=refusals,
    )


def serve(app: Any, settings: Settings, *, host: str, port: int, log_level: str) -> None:
    """Run `app` with uvicorn until interrupted, on guarded connections.

    Bound to loopback, the app refuses (421) a dotted `Host` name not in `allowed_hosts` (DNS
    rebinding; `services.fairness.host_allowed`).
    """
    if is_loopback_bind(host):
        refused = _error(421, "HostNotAllowedError", "the Host header names no address served")
        app = HostCheck(app, split(settings.allowed_hosts), refused)
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level=log_level,
        http=market_protocol(settings),
        ws="none",
        timeout_keep_alive=max(1, round(settings.keep_alive_s)),
        limit_concurrency=None,  # the protocol's budget (per address and in all) instead
        proxy_headers=False,  # the client address: `trusted_proxies` only
        timeout_graceful_shutdown=2,
        access_log=False,
    )
    redact_logs()  # after uvicorn configured its log handlers: they redact too
    uvicorn.Server(config).run()
