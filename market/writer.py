"""The single writer: one thread matches verified orders and commits them, in groups.

Requests verify their orders in their own threads, then queue them here and wait. The writer
takes every request waiting (up to `MAX_GROUP_ORDERS` orders), matches them in arrival order,
writes orders, nonces, fills, deals and resting orders' progress in **one transaction**, and
answers each request only after that `COMMIT` (group commit). So one commit serves several
requests, and parsing and signature checks never interleave with matching.

A request that fails on its own (an order id already placed, a nonce used before) fails alone:
when a group's nonce check finds a used nonce (or two requests of the group share one), no
engine has changed yet and its requests are retried one by one. If anything fails after the
engines changed, the transaction rolls back, every request of the group gets the error, and the
touched classes are rebuilt from SQL, so an engine never holds an order the database lacks.

Memory follows the live book: once a group is committed, every order it filled or cancelled
leaves its engine (`MatchingEngine.release`), and the writer keeps no nonce in memory, only a
bounded mark per signer seen lately (`market.nonces.NonceMarks`). Before matching a group it
asks SQL, in one indexed query, which of the group's (signer, nonce) pairs at or below their
signer's mark are stored (pairs above it cannot be): a used one is refused before any engine
changes, as a duplicate if the stored order is the same signed order, else as a replay. The
unique (owner, nonce) index is the backstop: a group that still hits it rolls back and its
requests are retried one by one.

One writer serves every device class of its process (each class is still written by exactly
one thread): the database has one write lock and the interpreter one lock, so more writers would
only contend, and a batch spanning classes commits atomically. Processes that share a
PostgreSQL database each write their own classes (`market.partition`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from contextlib import ExitStack
from typing import NamedTuple, TypeVar

from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import DBAPIError, IntegrityError

from market import storage
from market.answers import Answer, LoopAnswer, Outbox, deliver
from market.books import Books, ClassBook
from market.engine.gate import Gate
from market.errors import DuplicateOrderError, ReplayError
from market.nonces import NonceMarks, nonce_stored, stored_pairs
from market.placement import Placed, Rows, match_orders, rematch_rows
from market.verify import CheckedOrder
from services.threads import name_os_thread

T = TypeVar("T")
log = logging.getLogger(__name__)

IDLE_PING_S = 1.0
"""A connection idle this long is pinged before it serves a group."""

MAX_GROUP_ORDERS = 1_000
"""Orders one group commit may carry (a request is never split)."""

WRITER_AUTOCHECKPOINT_PAGES = 100_000
"""Log pages (about 400 MB) past which SQLite checkpoints inside the writer's own commit: a
backstop only. The writer checkpoints between groups when `market.checkpoint` asks
(`Writer.checkpoint_soon`), after that thread did the bulk of the work."""


class _Request(NamedTuple):
    orders: list[CheckedOrder]
    now: int
    future: Answer


class _Call(NamedTuple):
    function: Callable[[], object]
    future: Future[object]


class Writer:
    """The thread that changes the books; `place` queues a request and waits for its commit."""

    def __init__(
        self,
        *,
        books: Books,
        db: Engine,
        on_commit: Callable[[list[list[Placed]]], None],
        gate: Callable[[int], Gate] | None = None,
        on_rows: Callable[[Rows], None] | None = None,
        lock_seq: Callable[[Connection], None] | None = None,
        sole_writer: bool = True,
    ) -> None:
        """Start the writer thread; `on_commit` gets each committed group's results, `on_rows`
        (if given) the rows of every committed placement and rematch (the funds check counts
        commitments from them, `market.commitments`); `gate(now)` (if given) says what may
        trade in each group (`market.engine.gate`); `lock_seq` (if given: other processes write
        fills too, `market.partition`) is taken before fills are numbered, and the last `seq`
        is then always read from SQL. `sole_writer` says no other process stores orders or
        cancels in the database: only then are nonce marks kept (`market.nonces`)."""
        self._books = books
        self._on_rows = on_rows
        self._gate = gate
        self._lock_seq = lock_seq
        self._db = db
        self._on_commit = on_commit
        self._connection: Connection | None = None  # the writer thread's, kept between groups
        self._used_at = 0.0  # when `_connection` last served a group (monotonic)
        self._fill_seq: int | None = None  # the last committed fill's `seq`; None: ask SQL
        self._marks = NonceMarks() if sole_writer else None  # used by the writer thread only
        self._outbox: Outbox = {}  # loops' outcomes of the group being written (writer only)
        self._checkpoint_due = threading.Event()  # set by `checkpoint_soon`, any thread
        self._queue: queue.SimpleQueue[_Request | _Call | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="market-writer", daemon=True)
        self._thread.start()

    def place(self, orders: list[CheckedOrder], now: int) -> list[Placed]:
        """Match and commit verified orders atomically; return each order's result in order.

        Raise `DuplicateOrderError` or `ReplayError` if one was placed or its nonce used
        before, or whatever made the commit fail.
        """
        return self.submit(orders, now).result()

    def submit(self, orders: list[CheckedOrder], now: int) -> Future[list[Placed]]:
        """Queue verified orders like `place`; return the future of their results (set after
        the commit), for callers that must not block (an event loop)."""
        if not self._thread.is_alive():
            raise RuntimeError("the market's writer has stopped")
        future: Future[list[Placed]] = Future()
        self._queue.put(_Request(orders, now, future))
        return future

    def submit_async(self, orders: list[CheckedOrder], now: int) -> asyncio.Future[list[Placed]]:
        """Queue verified orders like `submit`, from an event loop; return an asyncio future
        of their results. The writer wakes each loop once per group, not once per request."""
        if not self._thread.is_alive():
            raise RuntimeError("the market's writer has stopped")
        loop = asyncio.get_running_loop()
        future: asyncio.Future[list[Placed]] = loop.create_future()
        self._queue.put(_Request(orders, now, LoopAnswer(future, loop, self._outbox)))
        return future

    def call(self, function: Callable[[], T]) -> T:
        """Run `function` in the writer thread between groups (other writes: cancel, expire)."""
        if not self._thread.is_alive():
            raise RuntimeError("the market's writer has stopped")
        job = _Call(function, Future())
        self._queue.put(job)
        return job.future.result()  # type: ignore[return-value]  # the future holds a T

    def rematch(self, now: int, created_at: float) -> int:
        """Match again, class by class, the resting orders the gate held back and commit their
        fills (`MatchingEngine.rematch`); return how many fills. Without a gate nothing is
        ever held back, so nothing is done."""
        if self._gate is None:
            return 0
        return self.call(lambda: self._rematch(now, created_at))

    def _rematch(self, now: int, created_at: float) -> int:
        assert self._gate is not None
        total = 0
        for name, book in self._books.items():
            with book.lock:
                fills = book.engine.rematch(now, self._gate(now))
                if not fills:
                    continue
                rows = rematch_rows(fills, book, created_at)
                connection = self._connect()
                try:
                    fill_seq = self._write(connection, rows)
                    connection.commit()
                except BaseException:
                    try:
                        connection.rollback()
                    finally:
                        self._disconnect()
                        self._books.rebuild([name])
                    raise
                self._fill_seq = fill_seq
                release(book)
                if self._on_rows is not None:
                    self._on_rows(rows)
                total += len(fills)
        return total

    def nonce_used(self, owner: str, nonce: int) -> bool:
        """Return whether an order or a cancel of `owner` used `nonce` (one indexed read)."""
        with self._db.connect() as connection:
            return nonce_stored(connection, [(owner, nonce)])

    def storing_nonce(self, owner: str, nonce: int) -> None:
        """Note, in the writer thread and before the commit, a cancel's nonce being stored
        (its signer's mark rises, `market.nonces`)."""
        if self._marks is not None:
            self._marks.raise_to([(owner, nonce)])

    def checkpoint_soon(self) -> None:
        """Ask the writer to checkpoint its SQLite log on its own connection once it has
        answered its current group (from `market.checkpoint`'s thread, after a checkpoint
        there): what it committed meanwhile is copied, and its next commit starts the log
        over. Any thread may call this; a writer without a connection does nothing."""
        self._checkpoint_due.set()

    def pending(self) -> int:
        """Return how many jobs wait for the writer (approximately: the queue is live)."""
        return self._queue.qsize()

    def close(self) -> None:
        """Finish the queued requests, then stop the thread."""
        if self._thread.is_alive():
            self._queue.put(None)
            self._thread.join()

    # -- the thread ---------------------------------------------------------------------------

    def _run(self) -> None:
        name_os_thread(self._thread.name)
        try:
            self._serve()
        finally:
            self._disconnect()

    def _connect(self) -> Connection:
        """Return the writer's connection, opening it if needed: one pool checkout for many
        groups, not one per group. One idle for `IDLE_PING_S` is pinged first (before any engine
        changes), so a database restarted meanwhile costs a reconnect, not a failed group."""
        connection = self._connection
        now = time.monotonic()
        if connection is not None and now - self._used_at > IDLE_PING_S:
            try:
                connection.exec_driver_sql("SELECT 1")
            except DBAPIError:
                with contextlib.suppress(DBAPIError):
                    self._disconnect()
                connection = self._connection = None
                self._fill_seq = None
        if connection is None:
            connection = self._connection = self._db.connect()
            if connection.dialect.name == "sqlite":
                connection.exec_driver_sql(
                    f"PRAGMA wal_autocheckpoint={WRITER_AUTOCHECKPOINT_PAGES}"
                )
                connection.commit()
        self._used_at = now
        return connection

    def _write(self, connection: Connection, rows: Rows) -> int | None:
        """Write one group's rows (uncommitted); return the last fill `seq` they use."""
        last = self._fill_seq
        if self._lock_seq is not None and rows.fills:
            self._lock_seq(connection)  # held until the commit: `seq` follows commit order
            last = None
        return storage.record_placement(
            connection=connection,
            orders=rows.orders,
            updates=rows.updates,
            fills=rows.fills,
            deals=rows.deals,
            last_fill_seq=last,
        )

    def _disconnect(self) -> None:
        """Drop the writer's connection (after a failure, or at the end): the next group opens
        a fresh one, and the next fill asks SQL for the last `seq`."""
        connection, self._connection, self._fill_seq = self._connection, None, None
        if connection is not None:
            connection.close()

    def _serve(self) -> None:
        get, get_nowait = self._queue.get, self._queue.get_nowait
        while True:
            if self._checkpoint_due.is_set():  # after the last job, before waiting
                self._checkpoint()
            first = get()
            if first is None:
                return
            if isinstance(first, _Call):
                _run_call(first)
                continue
            group = [first]
            size = len(first.orders)
            after: _Call | None = None
            stop = False
            while size < MAX_GROUP_ORDERS:
                try:
                    job = get_nowait()
                except queue.Empty:
                    break
                if job is None:
                    stop = True
                    break
                if isinstance(job, _Call):
                    after = job
                    break
                group.append(job)
                size += len(job.orders)
            try:
                self._apply(group)
            finally:
                self._send_outbox()
            if after is not None:
                _run_call(after)
            if stop:
                return

    def _checkpoint(self) -> None:
        """Checkpoint the log on the writer's connection (`checkpoint_soon`): PASSIVE, between
        groups, after the last group was answered. A failure is logged and the connection
        dropped (the next group opens a fresh one); the background checkpoints go on."""
        self._checkpoint_due.clear()
        connection = self._connection
        if connection is None:
            return
        try:
            connection.exec_driver_sql("PRAGMA wal_checkpoint(PASSIVE)")
            connection.commit()
        except DBAPIError as exc:
            log.warning("the writer's WAL checkpoint failed: %s", exc)
            with contextlib.suppress(DBAPIError):
                self._disconnect()

    def _send_outbox(self) -> None:
        """Hand the group's outcomes to their loops: one thread-safe call per loop."""
        outbox = self._outbox
        for loop, outcomes in list(outbox.items()):
            del outbox[loop]
            with contextlib.suppress(RuntimeError):  # a closed loop: nobody awaits these
                loop.call_soon_threadsafe(deliver, outcomes)

    def _apply(self, group: list[_Request]) -> None:
        try:
            if self._commit(group, alone=len(group) == 1):
                return
        except BaseException as exc:  # every waiting request gets the error
            _fail(group, exc)
            return
        for request in group:  # a nonce was used before: find whose, one request at a time
            if request.future.done():
                continue
            try:
                self._commit([request], alone=True)
            except BaseException as exc:
                _fail([request], exc)

    def _commit(self, group: list[_Request], *, alone: bool) -> bool:
        """Match and commit `group`; return False if it holds a used nonce and is not `alone`."""
        names = sorted({c.order.device_class for r in group for c in r.orders})
        books = {name: self._books.get(name) for name in names}
        with ExitStack() as held:
            for name in names:
                held.enter_context(books[name].lock)
            live = [r for r in group if _fresh(r, books)]
            if not live:
                return True
            # Each order claims its nonce in its own row (a unique index is the backstop); one
            # indexed read finds a used one before any matching.
            pairs = [(c.order.owner, c.nonce) for r in live for c in r.orders]
            if len(set(pairs)) < len(pairs):
                if not alone:
                    return False
                live[0].future.set_exception(ReplayError("a nonce appears twice in the request"))
                return True
            connection = self._connect()
            try:
                marks = self._marks
                maybe = pairs if marks is None else marks.to_look_up(connection, pairs)
                used = stored_pairs(connection, maybe) if maybe else {}
                if used:
                    connection.rollback()  # end the read transaction
            except BaseException:
                self._disconnect()
                raise
            if used:
                if not alone:
                    return False
                live[0].future.set_exception(_replay(live[0], used))
                return True
            try:
                gate = None if self._gate is None else self._gate(live[0].now)
                results, rows = match_orders([(r.orders, r.now) for r in live], books, gate)
                fill_seq = self._write(connection, rows)
                if marks is not None:
                    marks.raise_to(pairs)  # before the commit: a mark is never too low
                connection.commit()
                self._fill_seq = fill_seq
            except IntegrityError:
                self._fill_seq = None
                try:
                    connection.rollback()
                    self._books.rebuild(names)
                    if not alone:
                        return False  # the backstop: retried one request at a time
                    hits = sorted(p for p in pairs if nonce_stored(connection, [p]))
                    connection.rollback()  # end the read transaction of the lookups
                except BaseException:
                    self._disconnect()
                    raise
                if not hits:
                    raise
                owner, nonce = hits[0]
                live[0].future.set_exception(
                    ReplayError(f"nonce {nonce} of {owner} was used before")
                )
                return True
            except BaseException:
                try:
                    connection.rollback()
                finally:
                    self._disconnect()  # whatever failed, the next group starts afresh
                    self._books.rebuild(names)
                raise
            for book in books.values():
                release(book)
            if self._on_rows is not None:  # counted before any request is answered
                self._on_rows(rows)
        for request, placed in zip(live, results, strict=True):
            request.future.set_result(placed)
        self._on_commit(results)
        return True


def _fresh(request: _Request, books: dict[str, ClassBook]) -> bool:
    """Fail `request` with `DuplicateOrderError` if one of its orders was placed before."""
    for c in request.orders:
        if c.order.order_id in books[c.order.device_class].engine:
            request.future.set_exception(DuplicateOrderError(c.order.order_id))
            return False
    return True


def release(book: ClassBook) -> None:
    """Forget, after their commit, the orders a class's engine saw filled or cancelled."""
    released = book.engine.release()
    if released and book.quote_hashes:
        hashes = book.quote_hashes
        for order_id in released:
            hashes.pop(order_id, None)


def _replay(request: _Request, used: dict[tuple[str, int], str | None]) -> Exception:
    """Return the error for a request whose nonce `used` names: a duplicate if the stored
    order is one of its own orders, else a replay."""
    for c in request.orders:
        pair = (c.order.owner, c.nonce)
        if pair in used:
            if used[pair] == c.order.order_id:
                return DuplicateOrderError(c.order.order_id)
            return ReplayError(f"nonce {c.nonce} of {c.order.owner} was used before")
    return ReplayError("a nonce of the request was used before")


def _run_call(call: _Call) -> None:
    try:
        call.future.set_result(call.function())
    except BaseException as exc:  # the caller gets the error
        call.future.set_exception(exc)


def _fail(group: list[_Request], exc: BaseException) -> None:
    for request in group:
        if not request.future.done():
            request.future.set_exception(exc)
