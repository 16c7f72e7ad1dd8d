"""Provider registry: signed heartbeats in, adverts with verified reliability out."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends
from pydantic_core import from_json
from starlette.concurrency import run_in_threadpool

from market.api.body import JsonBody, Parsed, heartbeat_limits, json_body
from market.api.deps import ServiceDep
from market.models import HeartbeatCreate, ProviderPublic

router = APIRouter(prefix="/v1/providers", tags=["providers"])


HeartbeatBody = Annotated[
    Parsed[HeartbeatCreate], Depends(JsonBody(HeartbeatCreate, heartbeat_limits))
]


@router.post("/heartbeat", openapi_extra=json_body(HeartbeatCreate))
async def heartbeat(body: HeartbeatBody, service: ServiceDep) -> ProviderPublic:
    """Record a provider's signed advert (the signature covers the advert's canonical JSON)."""
    # The advert as sent (extra keys included), decoded by the same depth-limited parser.
    raw: dict[str, Any] = from_json(body.raw)["advert"]
    return await run_in_threadpool(service.heartbeat, body.model, raw)


@router.get("")
def list_providers(service: ServiceDep) -> list[ProviderPublic]:
    """List providers, most recently seen first, with reliability from on-chain outcomes."""
    return service.providers()
