"""Serving the app with uvicorn on connections a slow or idle client cannot hold open.

The protocol (`contracts.serving.guarded_protocol`, shared with the provider daemon) closes a
new connection that sends nothing within the keep-alive timeout, a request that does not
arrive whole (request line, headers and body) within `request_read_timeout_s` of its first
byte (a 408 if its headers never completed), and headers over `max_header_bytes` (a 400).

Bodies are capped per route by the app (`market.api.body`), so a request's size and the time
it may take to arrive are both bounded.
"""

from __future__ import annotations

from typing import Any

import uvicorn

from contracts.serving import GuardedHttpToolsProtocol, guarded_protocol, redact_logs
from market.settings import Settings


def market_protocol(settings: Settings) -> type[GuardedHttpToolsProtocol]:
    """Return the protocol class with the read timeout and header cap of `settings`."""
    return guarded_protocol(
        "MarketHttpProtocol",
        read_timeout=settings.request_read_timeout_s,
        max_header_bytes=settings.max_header_bytes,
    )


def serve(app: Any, settings: Settings, *, host: str, port: int, log_level: str) -> None:
    """Run `app` with uvicorn until interrupted, on guarded connections."""
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level=log_level,
        http=market_protocol(settings),
        ws="none",
        timeout_keep_alive=max(1, round(settings.keep_alive_s)),
        limit_concurrency=settings.max_connections,
        timeout_graceful_shutdown=2,
        access_log=False,
    )
    redact_logs()  # after uvicorn configured its log handlers: they redact too
    uvicorn.Server(config).run()
