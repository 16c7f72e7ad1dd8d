"""Arbiters advertise on the market: a signed advert in, the adverts out.

An arbiter (``tpumarket arbiter run``) states what naming it in a deal means: its fee per
disputed batch (paid by the side that loses), its tolerance policy, its evidence window and
ruling margin, and its own ruling time measured from its journal. The advert is signed by the
arbiter's key over :func:`contracts.evidence.arbiter_advert_digest` (the keccak256 of the
advert's canonical JSON and a timestamp, under this market's domain); the market keeps the
latest advert of each arbiter, refusing one signed by another key, one whose timestamp is
not after the stored one (a replay), and one whose timestamp is off the market's clock.

Asks and bids do not carry arbiter lists: a provider's ask names the arbiter of its quote (one
of those the provider accepts, ``ask.arbiters``), a client refuses a quote naming an arbiter
outside its own list (``TPUMARKET_ARBITERS``), and both read the adverts here to choose.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict
from pydantic import Field as PField

from contracts.evidence import arbiter_advert_digest
from contracts.orders import advert_hash
from market import errors
from market.models import ADDRESS, HEX_SIGNATURE, INT64, ArbiterAdvertRow
from market.service import MarketService
from market.verify import checksum, recover

MAX_TOLERANCE_ENTRIES = 16


class ToleranceIn(BaseModel):
    """One dtype's bounds: ``|re-executed - delivered| <= atol + rtol * |delivered|``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    rtol: float = PField(ge=0, le=1)
    atol: float = PField(ge=0, le=1e6)


class ArbiterAdvertIn(BaseModel):
    """What an arbiter advertises (hashed into its signature)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    role: Literal["arbiter"]
    arbiter: str = PField(pattern=ADDRESS)
    url: str = PField(min_length=1, max_length=256, description="its evidence and rulings API")
    fee: int = PField(ge=0, le=INT64, description="per disputed batch, paid by the loser")
    evidence_window_s: int = PField(gt=0, le=INT64)
    ruling_margin_s: int = PField(ge=0, le=INT64)
    tolerance: dict[str, ToleranceIn] = PField(max_length=MAX_TOLERANCE_ENTRIES)
    rulings: int = PField(ge=0, le=INT64, description="rulings in its journal")
    ruling_s_p50: float | None = PField(
        default=None, ge=0, le=1e12, description="median chain seconds from dispute to ruling"
    )


class ArbiterAdvertCreate(BaseModel):
    """A signed arbiter advert."""

    model_config = ConfigDict(extra="forbid")

    arbiter: str = PField(pattern=ADDRESS)
    timestamp: int = PField(ge=0, le=2**63 - 1)
    advert: ArbiterAdvertIn
    signature: str = PField(pattern=HEX_SIGNATURE)


class ArbiterPublic(BaseModel):
    """An arbiter's latest advert, with the signature anyone can check."""

    address: str
    timestamp: int
    last_seen: float
    advert: dict[str, Any]
    signature: str


def _public(row: ArbiterAdvertRow) -> ArbiterPublic:
    return ArbiterPublic(
        address=row.address,
        timestamp=row.advert_ts,
        last_seen=row.last_seen,
        advert=json.loads(row.advert_json),
        signature=row.signature,
    )


def record_advert(
    *, service: MarketService, body: ArbiterAdvertCreate, raw: dict[str, Any]
) -> ArbiterPublic:
    """Check and store an arbiter's signed advert (``raw`` is the advert as sent)."""
    now = service.clock()
    arbiter = checksum(body.arbiter)
    if body.advert.arbiter.lower() != arbiter.lower():
        raise errors.InvalidRequestError(
            f"the advert names {body.advert.arbiter}, not its signer {arbiter}"
        )
    skew = service.settings.heartbeat_skew_s
    if abs(body.timestamp - now) > skew:
        raise errors.SignatureExpiredError(
            f"advert timestamp {body.timestamp} is more than {skew}s from the market clock "
            f"{int(now)}"
        )
    digest = arbiter_advert_digest(service.domain, advert_hash(raw), body.timestamp)
    signer = recover("arbiter advert", digest, body.signature)
    if signer != arbiter.lower():
        raise errors.AuthError(f"arbiter advert signed by {signer}, not by {arbiter}")
    service.address_limiter.take(arbiter)
    with service.session() as session:
        row = session.get(ArbiterAdvertRow, arbiter)
        if row is not None and body.timestamp <= row.advert_ts:
            raise errors.ReplayError(
                f"advert timestamp {body.timestamp} is not after {row.advert_ts}"
            )
        if row is None:
            row = ArbiterAdvertRow(
                address=arbiter,
                advert_ts=body.timestamp,
                advert_json="",
                signature="",
                last_seen=now,
            )
        row.advert_ts = body.timestamp
        row.advert_json = json.dumps(raw, sort_keys=True)
        row.signature = body.signature.lower()
        row.last_seen = now
        session.add(row)
        session.commit()
        session.refresh(row)
        return _public(row)


def list_arbiters(*, service: MarketService) -> list[ArbiterPublic]:
    """Return every arbiter's latest advert, most recently seen first."""
    from sqlmodel import col, select

    with service.session() as session:
        rows = session.exec(
            select(ArbiterAdvertRow).order_by(col(ArbiterAdvertRow.last_seen).desc())
        )
        return [_public(r) for r in rows]


def get_arbiter(*, service: MarketService, address: str) -> ArbiterPublic:
    """Return one arbiter's latest advert; raise ``NotFoundError`` if it never advertised."""
    with service.session() as session:
        row = session.get(ArbiterAdvertRow, checksum(address))
        if row is None:
            raise errors.NotFoundError(f"no advert of arbiter {address}")
        return _public(row)
