"""The FastAPI application: routes, error mapping, limits, metrics, jobs and the web page."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path

from fastapi import Depends, FastAPI
from fastapi.responses import FileResponse, Response
from fastapi.staticfiles import StaticFiles
from prometheus_client import generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from contracts.messages import ZERO_ADDRESS
from market import heap
from market.api import errors, methods
from market.api.body import publish_schemas
from market.api.deps import limit_ip
from market.api.fast import FastOrders, MarketApp
from market.api.limits import BodySizeLimit, SecurityHeaders
from market.api.routes import arbiters, book, deals, orders, providers, stream
from market.arbiters import ArbiterAdvertCreate
from market.follower import ChainFollow
from market.indexer import Indexer
from market.jobs import start_scheduler
from market.models import CancelCreate, HeartbeatCreate, OrderBatch, OrderCreate, QuoteAttach
from market.service import MarketService
from market.settings import Settings
from services.serving import redact_logs, register_secret, restore_recursion_limit

WEB = Path(__file__).resolve().parent.parent / "web"


def create_app(
    settings: Settings | None = None,
    *,
    service: MarketService | None = None,
    indexer_factory: Callable[[MarketService], Indexer | None] | None = None,
    fast_orders: bool = True,
    settle_heap: bool = False,
) -> MarketApp:
    """Build the app; the service (database, books) is created at startup unless given.

    With `fast_orders`, ``POST /v1/orders`` is served by `market.api.fast.FastOrders` ahead of
    the framework (the same answers, cheaper); without it, by the FastAPI route. With
    `settle_heap` (a server process), what start-up built is moved out of the garbage
    collector's scans once started (`market.heap`)."""
    restore_recursion_limit()  # eth-account raised it: deep JSON would overflow the C stack
    settings = settings or (service.settings if service else Settings.from_env())
    register_secret(settings.rpc_url)  # its key never in an answer nor a log line
    register_secret(settings.database_url)
    redact_logs()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        svc = service or MarketService(settings)
        app.state.service = svc
        app.state.changes = stream.Changes(
            svc, max_streams=settings.max_streams, max_per_ip=settings.max_streams_per_ip
        )
        indexer: Indexer | ChainFollow | None = None
        if indexer_factory is not None:
            indexer = indexer_factory(svc)
        elif settings.rpc_url and settings.escrow != ZERO_ADDRESS:
            rpc_url, escrow = settings.rpc_url, settings.escrow

            def make_indexer() -> Indexer:
                return Indexer(
                    svc,
                    rpc_url=rpc_url,
                    escrow=escrow,
                    chunk_blocks=settings.index_chunk_blocks,
                    from_block=settings.index_from_block,
                    confirmations=settings.index_confirmations,
                )

            # Processes sharing a database index once between them (`market.follower`).
            indexer = ChainFollow(svc, make_indexer) if svc.partition.shared else make_indexer()
        app.state.indexer = indexer
        scheduler = start_scheduler(svc, indexer) if settings.run_jobs else None
        app.state.scheduler = scheduler
        if settle_heap:
            svc.metrics.heap_frozen.set(heap.settle())
        try:
            yield
        finally:
            app.state.changes.close()
            if scheduler is not None:
                scheduler.shutdown(wait=True)
            if service is None:
                svc.close()

    app = MarketApp(
        title="tpumarket market",
        version="1",
        description="Signed asks and bids for accelerator compute, matched into deal records "
        "that settle on the ComputeEscrow contract.",
        lifespan=lifespan,
        docs_url=None,  # FastAPI's pages load their UI from a CDN; `/docs` below is local
        redoc_url=None,
    )
    if service is not None:
        app.state.service = service  # usable before the lifespan runs (schema tools, tests)
    errors.install(app)
    methods.install(app)  # a 405 or OPTIONS names every method of the path
    limited = [Depends(limit_ip)]
    for module in (orders, deals, providers, arbiters, book, stream):
        app.include_router(module.router, dependencies=limited)
    # The bodies the routes read themselves (`market.api.body`), published all the same.
    publish_schemas(
        app,
        OrderCreate,
        OrderBatch,
        CancelCreate,
        HeartbeatCreate,
        QuoteAttach,
        ArbiterAdvertCreate,
    )
    app.add_middleware(BodySizeLimit, max_bytes=settings.max_body_bytes)
    app.add_middleware(SecurityHeaders)
    if fast_orders:
        app.fast = FastOrders(app)  # POST /v1/orders without the framework

    @app.get("/metrics", include_in_schema=False)
    def metrics() -> Response:
        svc: MarketService = app.state.service
        return Response(generate_latest(svc.registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/healthz", tags=["health"])
    def healthz() -> dict[str, str]:
        """Return ok while the process serves."""
        return {"status": "ok"}

    @app.get("/", include_in_schema=False)
    def index() -> FileResponse:
        return FileResponse(WEB / "index.html", headers={"Cache-Control": "no-cache"})

    @app.get("/docs", include_in_schema=False)
    def docs() -> FileResponse:
        """The API reference: a local page that renders `/openapi.json` (no CDN)."""
        return FileResponse(WEB / "docs.html", headers={"Cache-Control": "no-cache"})

    app.mount("/static", StaticFiles(directory=WEB), name="static")
    return app
