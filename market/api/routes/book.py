"""Market data: books, fills, price history, the domain to sign under (live updates: `stream`)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Path, Query

from market.api.deps import ServiceDep
from market.models import LABEL, BookPublic, FillPublic

router = APIRouter(prefix="/v1", tags=["market data"])

OVERVIEW_HISTORY_S = 3 * 3600
"""The page's price chart covers the last three hours in one-minute bars."""


@router.get("/domain")
def domain(service: ServiceDep) -> dict[str, Any]:
    """Return the EIP-712 domains: market messages (orders) and settlement messages (quotes)."""
    market = service.domain
    return {
        "market": {
            "name": market.name,
            "version": market.version,
            "chain_id": market.chain_id,
            "verifying_contract": market.verifying_contract,
        },
        "escrow": {
            "name": service.escrow_domain.name,
            "version": service.escrow_domain.version,
            "chain_id": service.escrow_domain.chain_id,
            "verifying_contract": service.escrow_domain.verifying_contract,
        },
    }


@router.get("/typed-data")
def typed_data(service: ServiceDep) -> dict[str, Any]:
    """Return the EIP-712 typed data of every settlement message, domain filled for the escrow.

    A wallet picks a type from `primaryTypes`, fills `message`, and signs
    `{"types", "primaryType", "domain", "message"}` with `eth_signTypedData_v4`.
    """
    return service.typed_data()


@router.get("/classes")
def classes(service: ServiceDep) -> list[str]:
    """Return the device classes that have a book."""
    return service.device_classes()


@router.get("/book/{device_class}")
def book(
    device_class: Annotated[str, Path(pattern=LABEL)],
    service: ServiceDep,
    levels: Annotated[int, Query(ge=1, le=500)] = 50,
) -> BookPublic:
    """Return a device class's bids and asks by price level, best first."""
    return service.book(device_class, levels)


@router.get("/fills")
def fills(
    service: ServiceDep,
    device_class: Annotated[str | None, Query(pattern=LABEL)] = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
) -> list[FillPublic]:
    """Return recent matches, newest first."""
    return service.fills(device_class=device_class, limit=limit)


@router.get("/history/{device_class}")
def history(
    device_class: Annotated[str, Path(pattern=LABEL)],
    service: ServiceDep,
    since: Annotated[int, Query(ge=0, le=2**63 - 1)] = 0,
    bucket_s: Annotated[int, Query(ge=1, le=86_400)] = 60,
) -> list[tuple[int, int, int, int, int, int]]:
    """Return price bars (start, open, high, low, close, volume) of a class's fills."""
    return service.history(device_class, since=since, bucket_s=bucket_s)


@router.get("/overview")
def overview(service: ServiceDep) -> dict[str, Any]:
    """Return everything the web order book shows, in one response."""
    names = service.device_classes()
    since = service.now() - OVERVIEW_HISTORY_S
    return {
        "version": service.version,
        "classes": names,
        "books": {n: service.book(n, 20).model_dump() for n in names},
        "fills": [f.model_dump() for f in service.fills(device_class=None, limit=30)],
        "providers": [p.model_dump() for p in service.providers()],
        "deals": [
            d.model_dump(exclude={"bid", "ask", "quote"})
            for d in service.deals(party=None, limit=30)
        ],
        "history": {n: service.history(n, since=since, bucket_s=60) for n in names},
    }
