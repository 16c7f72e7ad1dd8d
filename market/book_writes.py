"""What the writer thread changes in the books besides matching: a signed cancel, the expiry sweep.

Both run in the writer thread (`Writer.call`), hold the class's lock while they change its
engine, and commit before they return; a failed commit rebuilds the class from storage, so the
engine never holds what the database does not.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager

from sqlalchemy.exc import IntegrityError
from sqlmodel import Session

from market import storage
from market.books import Books
from market.errors import (
    ForbiddenError,
    OrderStateError,
    ReplayError,
    UnknownOrderError,
    WrongClassError,
)
from market.metrics import Metrics
from market.models import Order
from market.writer import Writer, release


def cancel(
    books: Books,
    writer: Writer,
    open_session: Callable[[], AbstractContextManager[Session]],
    order_id: str,
    owner: str,
    nonce: int,
    on_progress: Callable[[Iterable[tuple[str, str, int]]], None] | None = None,
) -> Order:
    """Cancel in the writer thread: claim the nonce, change the engine, commit; tell
    `on_progress` (the funds check's commitments) what changed once committed."""
    book = next((b for _, b in books.items() if order_id in b.engine), None)
    if book is None:
        with open_session() as session:
            stored = storage.get_order(session=session, order_id=order_id)
        if stored is None:
            raise UnknownOrderError(order_id)
        if stored.state in storage.LIVE_STATES:  # live, in a class another process matches
            raise WrongClassError(
                f"order {order_id} is in device class {stored.device_class!r}, matched by "
                "another market process: cancel it there"
            )
        # Not live, so no longer in the engine: filled, cancelled or expired.
        raise OrderStateError(order_id, stored.state, "cancelled")
    with book.lock, open_session() as session:
        record = book.engine.record(order_id)
        if record.order.owner != owner:
            raise ForbiddenError(f"order {order_id} belongs to {record.order.owner}")
        connection = session.connection()
        replay = ReplayError(f"nonce {nonce} of {owner} was used before")
        if writer.nonce_used(owner, nonce):  # this runs in the writer thread
            raise replay
        try:
            storage.use_nonces(connection=connection, pairs=[(owner, nonce)])
        except IntegrityError:
            session.rollback()
            raise replay from None
        writer.storing_nonce(owner, nonce)  # before the commit: its mark is never too low
        final = book.engine.cancel(order_id)  # may raise OrderStateError: nothing written
        updates = [(order_id, final.state.value, final.remaining)]
        try:
            storage.record_progress(connection=connection, updates=updates)
            session.commit()
        except BaseException:
            session.rollback()
            books.rebuild([record.order.device_class])
            raise
        release(book)  # the cancelled order leaves memory; its row and nonce stay in SQL
        if on_progress is not None:
            on_progress(updates)
        row = storage.get_order(session=session, order_id=order_id)
    assert row is not None
    return row


def expire(
    books: Books,
    open_session: Callable[[], AbstractContextManager[Session]],
    now: int,
    metrics: Metrics,
    on_progress: Callable[[Iterable[tuple[str, str, int]]], None] | None = None,
) -> int:
    """Expire every live order past `now` in every class, in the writer thread; return how
    many; tell `on_progress` what changed once committed."""
    total = 0
    for name, book in books.items():
        with book.lock:
            remembered = len(book.engine)
            expired = book.engine.expire(now)
            if len(book.engine) < remembered:  # it forgot orders: so do the quote hashes
                engine = book.engine
                book.quote_hashes = {i: h for i, h in book.quote_hashes.items() if i in engine}
            metrics.set_live(name, book.engine)  # here, not on the placement path
            if not expired:
                continue
            updates = [(r.order_id, r.state.value, r.remaining) for r in expired]
            with open_session() as session:
                try:
                    storage.record_progress(connection=session.connection(), updates=updates)
                    session.commit()
                except BaseException:
                    session.rollback()
                    books.rebuild([name])
                    raise
            if on_progress is not None:
                on_progress(updates)
        total += len(expired)
    return total
