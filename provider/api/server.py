"""Serving the daemon's API with uvicorn on connections a slow or idle client cannot hold open.

The protocol is the market's (:func:`services.serving.guarded_protocol`): a new connection
that sends nothing closes after ``keep_alive_s``, like one idle after an answer; a request must
arrive whole within ``request_read_timeout_s`` of its first byte, plus a second for every
:data:`MIN_UPLOAD_RATE` bytes of body received (a task envelope of many MiB on a fair link
arrives; a client sending a byte a second is cut off, with a 408 if its headers never
completed); request line and headers hold at most :data:`MAX_HEADER_BYTES`.
"""

from __future__ import annotations

import json
from typing import Any

import uvicorn

from provider.api.errors import error_body
from provider.config import ProviderConfig
from services.fairness import ConnectionBudget, TrustedProxies, is_loopback_bind
from services.serving import (
    REFUSAL_RETRY_S,
    GuardedHttpToolsProtocol,
    HostCheck,
    guarded_protocol,
    redact_logs,
)

MIN_UPLOAD_RATE = 64 * 1024
"""Bytes per second a body must keep arriving at, past the read timeout, not to be cut."""
MAX_HEADER_BYTES = 32 * 1024
"""Request line and headers (the signed task request is a few hundred bytes)."""


def _json(code: str, reason: str) -> bytes:
    return json.dumps(error_body(code, reason), separators=(",", ":")).encode()


def daemon_protocol(config: ProviderConfig) -> type[GuardedHttpToolsProtocol]:
    """Return the protocol class with the daemon's read timeout, upload rate, header cap and
    connection budget (``[http]``: per client address and in all)."""
    http = config.http
    budget = ConnectionBudget(
        max_total=http.max_connections,
        max_per_address=http.max_connections_per_ip,
        trusted=TrustedProxies(http.trusted_proxies),
    )
    refusals = {
        429: _json(
            "too_many_connections",
            f"at most {http.max_connections_per_ip} open connections from one client address; "
            f"retry after {REFUSAL_RETRY_S} s",
        ),
        503: _json(
            "overloaded",
            f"at most {http.max_connections} open connections; retry after {REFUSAL_RETRY_S} s",
        ),
    }
    return guarded_protocol(
        "ProviderHttpProtocol",
        read_timeout=config.request_read_timeout_s,
        max_header_bytes=MAX_HEADER_BYTES,
        min_body_rate=MIN_UPLOAD_RATE,
        timeout_body=json.dumps(
            error_body(
                "request_timeout",
                f"request not received within {config.request_read_timeout_s:g} s",
            ),
            separators=(",", ":"),
        ).encode(),
        budget=budget,
        refusal_bodies=refusals,
    )


def serve(app: Any, config: ProviderConfig) -> None:
    """Run ``app`` with uvicorn on the config's host and port until interrupted.

    Bound to loopback, ``app`` refuses (421) a dotted ``Host`` name not in
    ``[http] allowed_hosts`` (DNS rebinding; :func:`services.fairness.host_allowed`).
    """
    if is_loopback_bind(config.host):
        refused = _json("host_not_allowed", "the Host header names no address this daemon serves")
        app = HostCheck(app, config.http.allowed_hosts, refused)
    settings = uvicorn.Config(
        app,
        host=config.host,
        port=config.port,
        http=daemon_protocol(config),
        ws="none",
        timeout_keep_alive=max(1, round(config.keep_alive_s)),
        limit_concurrency=None,  # the protocol's budget (per address and in all) instead
        proxy_headers=False,  # the client address: [http] trusted_proxies only
        log_config=None,
        access_log=False,
    )
    redact_logs()  # the handlers uvicorn's config set up redact too
    uvicorn.Server(settings).run()
