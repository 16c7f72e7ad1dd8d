"""The FastAPI application of one daemon."""

from __future__ import annotations

from fastapi import FastAPI

from provider.api import errors
from provider.api.fast import FastTasks
from provider.api.routes import access, system, tasks, vouchers
from provider.daemon import Daemon
from services.serving import redact_logs, register_secret, restore_recursion_limit


def create_app(daemon: Daemon) -> FastTasks:
    """Return the API app serving ``daemon`` (whose lifecycle the caller owns).

    The FastAPI app serves every route; the task submission hot path answers in front of it,
    and every other request's body is capped and its JSON nesting bounded there too.
    """
    restore_recursion_limit()  # eth-account raised it: deep JSON would overflow the C stack
    config = daemon.config
    for secret in (config.rpc_url, config.market_url, config.private_key):
        register_secret(secret)  # never in an answer nor a log line (services.serving.redact)
    register_secret(config.private_key.removeprefix("0x"))
    redact_logs()
    app = FastAPI(
        title="tpumarket provider",
        version="1",
        description="Signed tasks in, signed acks and receipts out. See docs/provider-api.md.",
        docs_url=None,  # the interactive pages load their scripts from a CDN: the schema
        redoc_url=None,  # stays at /openapi.json, the reference is docs/provider-api.md
    )
    app.state.daemon = daemon
    errors.install(app)
    app.include_router(tasks.router)
    app.include_router(vouchers.router)
    app.include_router(access.router)
    app.include_router(system.router)
    return FastTasks(app, daemon)
