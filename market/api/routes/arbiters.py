"""Arbiter registry: signed adverts in, the adverts out (`market.arbiters`)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends
from pydantic_core import from_json
from starlette.concurrency import run_in_threadpool

from market.api.body import JsonBody, Parsed, heartbeat_limits, json_body
from market.api.deps import ServiceDep
from market.api.errors import DESCRIPTIONS, ErrorPublic
from market.arbiters import (
    ArbiterAdvertCreate,
    ArbiterPublic,
    get_arbiter,
    list_arbiters,
    record_advert,
)

router = APIRouter(prefix="/v1/arbiters", tags=["arbiters"])


def _errors(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """The error statuses a route answers beyond the app's defaults (413, 422, 429)."""
    return {s: {"model": ErrorPublic, "description": DESCRIPTIONS[s]} for s in statuses}


AdvertBody = Annotated[
    Parsed[ArbiterAdvertCreate], Depends(JsonBody(ArbiterAdvertCreate, heartbeat_limits))
]


@router.post(
    "", openapi_extra=json_body(ArbiterAdvertCreate), responses=_errors(401, 403, 409, 415)
)
async def advertise(body: AdvertBody, service: ServiceDep) -> ArbiterPublic:
    """Record an arbiter's signed advert (the signature covers the advert's canonical JSON)."""
    raw: dict[str, Any] = from_json(body.raw)["advert"]
    return await run_in_threadpool(record_advert, service=service, body=body.model, raw=raw)


@router.get("")
def arbiters(service: ServiceDep) -> list[ArbiterPublic]:
    """List arbiters' adverts, most recently seen first."""
    return list_arbiters(service=service)


@router.get("/{address}", responses=_errors(404))
def arbiter(address: str, service: ServiceDep) -> ArbiterPublic:
    """Return one arbiter's latest advert (404 if it never advertised)."""
    return get_arbiter(service=service, address=address)
