"""The tape: fills newest first across classes, price bars, and each class's 24 h figures.

Fills are ordered by `seq`, the order in which they were committed across every class
(`market.storage.record_placement` numbers them), never by their whole-second times.
"""

from __future__ import annotations

from pydantic import BaseModel
from pydantic import Field as PField
from sqlalchemy import text
from sqlmodel import Session, col, select

from market.models import Fill, FillPublic

DAY_S = 86_400


def recent_fills(*, session: Session, device_class: str | None, limit: int) -> list[FillPublic]:
    """Return the latest fills, newest first across every class (by commit order, `seq`)."""
    query = select(Fill)
    if device_class is not None:
        query = query.where(Fill.device_class == device_class)
    query = query.order_by(col(Fill.seq).desc()).limit(limit)
    return [FillPublic.model_validate(r, from_attributes=True) for r in session.exec(query)]


def price_history(
    *, session: Session, device_class: str, since: int, bucket_s: int
) -> list[tuple[int, int, int, int, int, int]]:
    """Return (bucket start, open, high, low, close, volume) of fills per time bucket."""
    rows = session.exec(
        select(Fill.time, Fill.price, Fill.quantity)
        .where(Fill.device_class == device_class, Fill.time >= since)
        .order_by(col(Fill.seq))
    ).all()
    out: list[list[int]] = []
    for time, price, quantity in rows:
        start = time - time % bucket_s
        if out and out[-1][0] == start:
            bar = out[-1]
            bar[2] = max(bar[2], price)
            bar[3] = min(bar[3], price)
            bar[4] = price
            bar[5] += quantity
        else:
            out.append([start, price, price, price, price, quantity])
    return [(b[0], b[1], b[2], b[3], b[4], b[5]) for b in out]


class StatsPublic(BaseModel):
    """A class's trading over the last 24 hours."""

    device_class: str
    last_price: int | None = PField(description="price of the newest fill, token base units")
    last_time: int | None = PField(description="unix time of the newest fill")
    change_24h: int | None = PField(
        description="last_price minus the price 24 h ago (the last fill before the window, "
        "else the window's first)"
    )
    change_24h_pct: float | None
    high_24h: int | None
    low_24h: int | None
    volume_24h: int = PField(description="units traded in 24 h")
    trades_24h: int


def class_stats(*, session: Session, device_class: str, now: int) -> StatsPublic:
    """Return a class's last price, 24 h change, range and volume, from SQL aggregates."""
    since = now - DAY_S
    params = {"c": device_class, "since": since}
    last = (
        session.connection()
        .execute(
            text("SELECT price, time FROM fills WHERE device_class = :c ORDER BY seq DESC LIMIT 1"),
            params,
        )
        .first()
    )
    # A float sum: a day's volume cannot overflow int64 in SQL (exact below 2**53 units).
    count, volume, low, high = (
        session.connection()
        .execute(
            text(
                "SELECT COUNT(*), SUM(CAST(quantity AS DOUBLE PRECISION)), MIN(price), MAX(price) "
                "FROM fills WHERE device_class = :c AND time >= :since"
            ),
            params,
        )
        .one()
    )
    before = (
        session.connection()
        .execute(
            text(
                "SELECT price FROM fills WHERE device_class = :c AND time < :since "
                "ORDER BY seq DESC LIMIT 1"
            ),
            params,
        )
        .first()
    )
    if before is None:
        before = (
            session.connection()
            .execute(
                text(
                    "SELECT price FROM fills WHERE device_class = :c AND time >= :since "
                    "ORDER BY seq LIMIT 1"
                ),
                params,
            )
            .first()
        )
    last_price = int(last[0]) if last else None
    ref = int(before[0]) if before else None
    change = last_price - ref if last_price is not None and ref is not None else None
    return StatsPublic(
        device_class=device_class,
        last_price=last_price,
        last_time=int(last[1]) if last else None,
        change_24h=change,
        change_24h_pct=round(100 * change / ref, 2) if change is not None and ref else None,
        high_24h=int(high) if high is not None else None,
        low_24h=int(low) if low is not None else None,
        volume_24h=int(volume or 0),
        trades_24h=int(count),
    )
