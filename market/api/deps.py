"""Dependencies of the API routes (`Annotated` aliases, as in full-stack-fastapi-template)."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from market.service import MarketService

# Both are `async def` on purpose: FastAPI runs a plain `def` dependency in its thread pool,
# a thread hop per request for what is a dictionary lookup.


async def get_service(request: Request) -> MarketService:
    """Return the market service of the running app."""
    service: MarketService = request.app.state.service
    return service


async def limit_ip(request: Request) -> None:
    """Spend one token of the caller's IP bucket (429 when empty)."""
    service: MarketService = request.app.state.service
    host = request.client.host if request.client else "unknown"
    service.ip_limiter.take(host)


ServiceDep = Annotated[MarketService, Depends(get_service)]
