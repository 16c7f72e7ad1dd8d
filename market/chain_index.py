"""SQL storage of the chain index: the escrow's deals and events the indexer read, its
positions, the per-(provider, client) settlement sums, and the link from a market deal record
to its on-chain deal. Keyword-only functions over a SQLModel session; nothing here commits."""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from sqlalchemy import delete, update
from sqlmodel import Session, col, select

from market.chain_moves import accounts_moved
from market.deal_states import DealStatus
from market.models import ChainDeal, ChainEvent, Deal, IndexerState, ProviderClient

# -- chain indexer ------------------------------------------------------------------------------


def indexed_block(*, session: Session, name: str) -> int | None:
    """Return the last block the indexer `name` finished, or None."""
    row = session.get(IndexerState, name)
    return None if row is None else row.block


def indexed_hash(*, session: Session, name: str) -> str | None:
    """Return the hash of the last block the indexer `name` finished, if it was kept."""
    row = session.get(IndexerState, name)
    return None if row is None else row.block_hash


def set_indexed_block(
    *, session: Session, name: str, block: int, block_hash: str | None = None
) -> None:
    """Record the last block the indexer `name` finished, and its hash when known."""
    row = session.get(IndexerState, name)
    if row is None:
        session.add(IndexerState(name=name, block=block, block_hash=block_hash))
    else:
        row.block, row.block_hash = block, block_hash
        session.add(row)


def add_chain_event(
    *,
    session: Session,
    tx_hash: str,
    log_index: int,
    block_number: int,
    name: str,
    chain_deal_id: int | None,
    args: dict[str, Any],
) -> bool:
    """Store an event once; return False if it was stored before."""
    if session.get(ChainEvent, (tx_hash, log_index)) is not None:
        return False
    session.add(
        ChainEvent(
            tx_hash=tx_hash,
            log_index=log_index,
            block_number=block_number,
            name=name,
            chain_deal_id=chain_deal_id,
            args_json=json.dumps(args, default=str),
        )
    )
    return True


def get_chain_deal(*, session: Session, chain_deal_id: int) -> ChainDeal | None:
    """Return an indexed on-chain deal, or None."""
    return session.get(ChainDeal, chain_deal_id)


def reset_chain_index(*, session: Session) -> None:
    """Forget everything indexed (another escrow's events): deals, events, sums, positions."""
    for model in (ProviderClient, ChainEvent, ChainDeal, IndexerState):
        session.execute(delete(model))
    session.execute(update(Deal).values(chain_deal_id=None))


def indexer_names(*, session: Session) -> list[str]:
    """Return the names of every indexer that recorded a position."""
    return list(session.exec(select(IndexerState.name)).all())


def provider_client(*, session: Session, provider: str, client: str) -> ProviderClient:
    """Return the settlement sums of one (provider, client) pair, created empty if new."""
    row = session.get(ProviderClient, (provider, client))
    if row is None:
        row = ProviderClient(provider=provider, client=client)
        session.add(row)
    return row


def provider_clients(
    *, session: Session, providers: Iterable[str] | None = None
) -> dict[str, list[ProviderClient]]:
    """Return the per-client settlement sums of providers (all if None), by provider address."""
    query = select(ProviderClient)
    if providers is not None:
        query = query.where(col(ProviderClient.provider).in_(list(providers)))
    out: dict[str, list[ProviderClient]] = {}
    for row in session.exec(query).all():
        out.setdefault(row.provider, []).append(row)
    return out


def chain_deals(*, session: Session, ids: Iterable[int]) -> dict[int, ChainDeal]:
    """Return indexed on-chain deals by id."""
    wanted = list(ids)
    if not wanted:
        return {}
    rows = session.exec(select(ChainDeal).where(col(ChainDeal.chain_deal_id).in_(wanted))).all()
    return {row.chain_deal_id: row for row in rows}


def link_chain_deal(
    *, session: Session, quote_hash: str, client: str, chain_deal_id: int
) -> Deal | None:
    """Attach an on-chain deal to the market deal record whose own quote opened it; return it.

    A deal's quote names its client and is attached to one record only, so the quote hash finds
    at most one record; an ask's quote (which names no client) opens nothing on chain.
    """
    deal = session.exec(
        select(Deal).where(
            Deal.quote_hash == quote_hash,
            col(Deal.quote_json).is_not(None),
            col(Deal.chain_deal_id).is_(None),
        )
    ).first()
    if deal is None or deal.client.lower() != client.lower():
        return None
    deal.chain_deal_id = chain_deal_id
    session.add(deal)
    return deal


def open_deal_stakes(*, session: Session, provider: str) -> int:
    """Return the stake `provider` has locked in its indexed deals not closed on chain."""
    rows = session.exec(
        select(ChainDeal.stake).where(
            ChainDeal.provider == provider, ChainDeal.status != DealStatus.CLOSED
        )
    ).all()
    return sum(int(stake) for stake in rows)


def moved_since(*, session: Session, after: int, upto: int) -> set[str]:
    """Return the accounts the events stored for blocks `after` + 1 to `upto` moved
    (`market.chain_moves`), as the indexer found them when it stored those events."""
    events = session.exec(
        select(ChainEvent).where(
            col(ChainEvent.block_number) > after, col(ChainEvent.block_number) <= upto
        )
    ).all()
    moved: set[str] = set()
    for event in events:
        parties = None
        if event.chain_deal_id is not None:
            deal = session.get(ChainDeal, event.chain_deal_id)
            parties = None if deal is None else (deal.client, deal.provider)
        moved |= accounts_moved(event.name, json.loads(event.args_json), parties)
    return moved
