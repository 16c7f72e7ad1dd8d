"""Live orders aggregated in SQL for the book and the offers: no engine lock, no walk of the book.

The writer commits a whole group of matched orders in one transaction, so a read sees the books
between two groups, never halfway through a match. Rows are live (`open`, `partially_filled`)
and unexpired at `now` (an order past its expiry trades no more, swept or not). Units are summed
in two halves (`remaining // 2**32`, `remaining % 2**32`), so no int64 SQL sum can overflow and
the total is exact.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any, NamedTuple

from sqlalchemy import bindparam, text
from sqlmodel import Session

from market.storage import LIVE_STATES

_HALF = 2**32
_LIVE = "state IN (" + ", ".join(f"'{s}'" for s in LIVE_STATES) + ") AND expiry > :now"
_UNITS = f"SUM(remaining / {_HALF}), SUM(remaining % {_HALF}), COUNT(*)"


class Level(NamedTuple):
    """Live units and orders at one price with one plan, SLO and memory."""

    price: int
    plan: str
    slo_ms: int
    memory: int
    quantity: int
    orders: int


class AskGroup(NamedTuple):
    """A provider's live asks at one price with one plan, SLO and memory, in one class."""

    owner: str
    device_class: str
    plan: str
    slo_ms: int
    memory: int
    price: int
    quantity: int
    orders: int


def book_levels(
    *,
    session: Session,
    device_class: str,
    side: str,
    now: int,
    limit: int,
    plan: str | None = None,
    slo_ms: int | None = None,
    memory: int | None = None,
    owners: Collection[str] | None = None,
) -> list[Level]:
    """Return a side's levels best first (ties by terms), as a buyer with `plan`, `slo_ms` and
    `memory` filters them: asks that could serve it, bids no more demanding; `owners`, if
    given, keeps only their orders."""
    if owners is not None and not owners:
        return []
    is_bid = side == "bid"
    where = [f"device_class = :c AND side = :side AND {_LIVE}"]
    params: dict[str, Any] = {"c": device_class, "side": side, "now": now, "limit": limit}
    if plan is not None:
        where.append("plan = :plan")
        params["plan"] = plan
    if slo_ms is not None:
        where.append("slo_ms >= :slo" if is_bid else "slo_ms <= :slo")
        params["slo"] = slo_ms
    if memory is not None:
        where.append("memory <= :mem" if is_bid else "memory >= :mem")
        params["mem"] = memory
    if owners is not None:
        where.append("owner IN :owners")
        params["owners"] = sorted(owners)
    statement = text(
        f"SELECT price, plan, slo_ms, memory, {_UNITS} FROM orders WHERE {' AND '.join(where)} "
        "GROUP BY price, plan, slo_ms, memory "
        f"ORDER BY price {'DESC' if is_bid else 'ASC'}, plan, slo_ms, memory LIMIT :limit"
    )
    if owners is not None:
        statement = statement.bindparams(bindparam("owners", expanding=True))
    rows = session.connection().execute(statement, params)
    return [
        Level(int(p), pl, int(s), int(m), _units(hi, lo), int(n)) for p, pl, s, m, hi, lo, n in rows
    ]


def book_terms(*, session: Session, device_class: str, now: int, limit: int) -> list[list[Any]]:
    """Return the distinct plans, SLOs and memories of a class's live orders, `limit` each."""
    rows = (
        session.connection()
        .execute(
            text(
                "SELECT DISTINCT plan, slo_ms, memory FROM orders "
                f"WHERE device_class = :c AND {_LIVE}"
            ),
            {"c": device_class, "now": now},
        )
        .all()
    )
    return [sorted({row[i] for row in rows})[:limit] for i in range(3)]


def ask_groups(
    *,
    session: Session,
    now: int,
    device_class: str | None = None,
    plan: str | None = None,
    max_slo_ms: int | None = None,
    min_memory: int | None = None,
    max_price: int | None = None,
) -> list[AskGroup]:
    """Return live asks grouped by owner, class, plan, SLO, memory and price, filtered."""
    where = [f"side = 'ask' AND {_LIVE}"]
    params: dict[str, Any] = {"now": now}
    for value, clause, name in (
        (device_class, "device_class = :c", "c"),
        (plan, "plan = :plan", "plan"),
        (max_slo_ms, "slo_ms <= :slo", "slo"),
        (min_memory, "memory >= :mem", "mem"),
        (max_price, "price <= :price", "price"),
    ):
        if value is not None:
            where.append(clause)
            params[name] = value
    rows = session.connection().execute(
        text(
            f"SELECT owner, device_class, plan, slo_ms, memory, price, {_UNITS} FROM orders "
            f"WHERE {' AND '.join(where)} "
            "GROUP BY owner, device_class, plan, slo_ms, memory, price"
        ),
        params,
    )
    return [
        AskGroup(o, c, pl, int(s), int(m), int(p), _units(hi, lo), int(n))
        for o, c, pl, s, m, p, hi, lo, n in rows
    ]


def _units(high: Any, low: Any) -> int:
    return int(high) * _HALF + int(low)


def bid_owners(
    *, session: Session, now: int, device_class: str | None = None
) -> list[tuple[str, int]]:
    """Return the owners of live bids (in one class, or all) with the lowest price each bids."""
    where = f"side = 'bid' AND {_LIVE}"
    params: dict[str, Any] = {"now": now}
    if device_class is not None:
        where += " AND device_class = :c"
        params["c"] = device_class
    rows = session.connection().execute(
        text(f"SELECT owner, MIN(price) FROM orders WHERE {where} GROUP BY owner"), params
    )
    return [(owner, int(price)) for owner, price in rows]
