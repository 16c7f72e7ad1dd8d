"""Deal records: both signed orders, the provider's quote, and the on-chain settlement."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Path, Query
from starlette.concurrency import run_in_threadpool

from market.api.body import JsonBody, Parsed, json_body, small_limits
from market.api.deps import ServiceDep
from market.models import ADDRESS, DealPublic, QuoteAttach

router = APIRouter(prefix="/v1/deals", tags=["deals"])


@router.get("")
def list_deals(
    service: ServiceDep,
    party: Annotated[str | None, Query(pattern=ADDRESS)] = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
) -> list[DealPublic]:
    """List deal records, newest first; `party` keeps those of one client or provider."""
    return service.deals(party=party, limit=limit)


DEAL_ID = r"^[a-z0-9][a-z0-9._-]{0,63}:[0-9]{1,19}$"


@router.get("/{deal_id}")
def get_deal(deal_id: Annotated[str, Path(pattern=DEAL_ID)], service: ServiceDep) -> DealPublic:
    """Return one deal record (what the client needs to open the deal on chain)."""
    return service.deal(deal_id)


AttachBody = Annotated[Parsed[QuoteAttach], Depends(JsonBody(QuoteAttach, small_limits))]


@router.post("/{deal_id}/quote", openapi_extra=json_body(QuoteAttach))
async def attach_quote(
    deal_id: Annotated[str, Path(pattern=DEAL_ID)], body: AttachBody, service: ServiceDep
) -> DealPublic:
    """Attach a fresh provider-signed quote to a matched deal not yet open on chain.

    An ask's quote has one nonce, so it opens one deal; when an ask fills several bids, the
    provider signs a quote per further deal (same plan and SLO, spend at least the deal's).
    """
    return await run_in_threadpool(service.attach_quote, deal_id, body.model)
