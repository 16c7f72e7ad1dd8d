"""Revoking a deal's result access tokens (its client's fresh signature)."""

from __future__ import annotations

import time
from functools import partial

from fastapi import APIRouter
from pydantic import BaseModel, ConfigDict, Field
from starlette.concurrency import run_in_threadpool

from provider.access import REVOKE_SCOPE
from provider.api.deps import DaemonDep
from provider.api.models import DealId

router = APIRouter(prefix="/v1", tags=["access"])


class RevokeIn(BaseModel):
    """A client's revocation of its deal's tokens issued at or before ``before``."""

    model_config = ConfigDict(extra="forbid")

    before: int = Field(ge=0, lt=2**64, description="unix seconds, near the provider's clock")
    signature: str = Field(
        max_length=200,
        description=(
            "the deal's client's signature of result_access_digest(domain, deal, "
            f"{REVOKE_SCOPE:#x}, before)"
        ),
    )


class RevokePublic(BaseModel):
    """The cut-off in force: every token of the deal issued at or before it is refused."""

    deal_id: int
    revoked_through: int


@router.post(
    "/deals/{deal_id}/access/revoke",
    response_model=RevokePublic,
    responses={403: {"description": "not the deal's client, or a cut-off not near now"}},
)
async def revoke_access(deal_id: DealId, body: RevokeIn, daemon: DaemonDep) -> RevokePublic:
    """Refuse from now on every access token of the deal issued at or before ``before``.

    ``before`` must lie within 300 s of the provider's clock; the cut-off only moves forward
    and survives a restart (it is on disk when this answers).
    """
    now = time.time()
    signer = daemon.access.revocation_signer(deal_id, body.before, body.signature, now)
    deal = await daemon.deals.aget(deal_id)  # after the signature: a stranger's costs no lookup
    cutoff = await run_in_threadpool(
        partial(daemon.access.revoke, signer=signer, client=deal.client, now=now),
        deal_id,
        body.before,
    )
    return RevokePublic(deal_id=deal_id, revoked_through=cutoff)
