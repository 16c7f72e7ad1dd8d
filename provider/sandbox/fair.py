"""Fair turns on the workers: per-client queues served round-robin, a cap per client.

A task enters the gate before it borrows a worker (or a validator) and leaves when it is
done. Waiting tasks queue per client; a freed slot goes to the next client in turn that has a
task waiting and fewer than ``per_client`` in flight (the fewest in flight first, then the
one let in least recently), never simply to the oldest task: a
client that queued many slow tasks first holds at most its share of the slots, and another
client's task is started at the next free slot. Threads call :meth:`FairGate.enter`; an
event loop awaits :meth:`FairGate.enter_async`. Thread-safe.
"""

from __future__ import annotations

import asyncio
import threading
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

SCHEDULE_LOG = 4096
"""How many grants :attr:`FairGate.schedule` remembers (oldest first out)."""


@dataclass(eq=False)
class _Waiter:
    client: str
    event: threading.Event | None = None
    loop: asyncio.AbstractEventLoop | None = None
    future: asyncio.Future[None] | None = None
    granted: bool = field(default=False)


class FairGate:
    """``slots`` tasks in flight at most, ``per_client`` of them one client's."""

    def __init__(self, slots: int, per_client: int) -> None:
        """Admit ``slots`` tasks at once, at most ``per_client`` of one client."""
        if slots < 1 or per_client < 1:
            raise ValueError("a gate needs at least one slot, one per client")
        self.slots = slots
        self.per_client = min(per_client, slots)
        self.schedule: deque[str] = deque(maxlen=SCHEDULE_LOG)
        """The clients in the order their tasks were let in (for tests and metrics)."""
        self._lock = threading.Lock()
        self._running: dict[str, int] = {}
        self._total = 0
        self._queues: dict[str, deque[_Waiter]] = {}  # clients with waiting tasks only
        self._last: dict[str, int] = {}  # when each client was last let in (a sequence number)
        self._seq = 0

    def waiting(self, client: str | None = None) -> int:
        """How many tasks wait (of ``client``, or of all)."""
        with self._lock:
            if client is not None:
                return len(self._queues.get(client, ()))
            return sum(len(q) for q in self._queues.values())

    def running(self, client: str) -> int:
        """How many of ``client``'s tasks are in flight."""
        with self._lock:
            return self._running.get(client, 0)

    def _admit(self, client: str) -> None:
        self._running[client] = self._running.get(client, 0) + 1
        self._total += 1
        self._seq += 1
        self._last[client] = self._seq
        self.schedule.append(client)
        if len(self._last) > 4 * SCHEDULE_LOG:  # forget clients with nothing in flight or queued
            live = self._running.keys() | self._queues.keys()
            self._last = {c: n for c, n in self._last.items() if c in live}

    def _queue(self, waiter: _Waiter) -> None:
        self._queues.setdefault(waiter.client, deque()).append(waiter)
        self._dispatch()

    def _next_client(self) -> str | None:
        """The waiting client under its cap with the fewest in flight, let in least recently."""
        eligible = [c for c in self._queues if self._running.get(c, 0) < self.per_client]
        if not eligible:
            return None
        return min(eligible, key=lambda c: (self._running.get(c, 0), self._last.get(c, 0)))

    def _dispatch(self) -> None:
        """Grant free slots to waiting tasks, client by client (hold the lock)."""
        while self._total < self.slots:
            client = self._next_client()
            if client is None:
                return  # nobody waits, or every waiting client is at its cap
            queue = self._queues[client]
            waiter = queue.popleft()
            if not queue:
                del self._queues[client]
            waiter.granted = True
            self._admit(client)
            if waiter.event is not None:
                waiter.event.set()
            elif waiter.loop is not None and waiter.future is not None:
                waiter.loop.call_soon_threadsafe(_resolve, waiter.future)

    def enter(self, client: str) -> None:
        """Wait for ``client``'s turn and a free slot (a thread)."""
        waiter = _Waiter(client, event=threading.Event())
        with self._lock:
            self._queue(waiter)
            if waiter.granted:
                return
        assert waiter.event is not None
        waiter.event.wait()

    async def enter_async(self, client: str) -> None:
        """:meth:`enter` for an event loop; a cancelled waiter gives its place back."""
        loop = asyncio.get_running_loop()
        waiter = _Waiter(client, loop=loop, future=loop.create_future())
        with self._lock:
            self._queue(waiter)
            if waiter.granted:
                return
        assert waiter.future is not None
        try:
            await waiter.future
        except asyncio.CancelledError:
            with self._lock:
                if waiter.granted:
                    self._release(client)
                else:
                    queue = self._queues.get(client)
                    if queue is not None and waiter in queue:
                        queue.remove(waiter)
                        if not queue:
                            del self._queues[client]
            raise

    def _release(self, client: str) -> None:
        left = self._running.get(client, 0) - 1
        if left > 0:
            self._running[client] = left
        else:
            self._running.pop(client, None)
        self._total -= 1
        self._dispatch()

    def leave(self, client: str) -> None:
        """A task of ``client`` is done: its slot goes to the next client in turn."""
        with self._lock:
            self._release(client)

    @contextmanager
    def held(self, client: str) -> Iterator[None]:
        """Hold a slot for ``client`` for the length of the block."""
        self.enter(client)
        try:
            yield
        finally:
            self.leave(client)


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


__all__ = ["FairGate"]
