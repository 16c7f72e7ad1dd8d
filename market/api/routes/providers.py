"""Provider registry: signed heartbeats in, adverts with verified reliability out."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from starlette.concurrency import run_in_threadpool

from market.api.deps import ServiceDep
from market.models import HeartbeatCreate, ProviderPublic

router = APIRouter(prefix="/v1/providers", tags=["providers"])


@router.post("/heartbeat")
async def heartbeat(
    heartbeat: HeartbeatCreate, request: Request, service: ServiceDep
) -> ProviderPublic:
    """Record a provider's signed advert (the signature covers the advert's canonical JSON)."""
    raw: dict[str, Any] = (await request.json())["advert"]
    return await run_in_threadpool(service.heartbeat, heartbeat, raw)


@router.get("")
def list_providers(service: ServiceDep) -> list[ProviderPublic]:
    """List providers, most recently seen first, with reliability from on-chain outcomes."""
    return service.providers()
