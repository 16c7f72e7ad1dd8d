"""Long-polling a task until it is delivered, without a thread per waiter."""

from __future__ import annotations

import asyncio
from concurrent.futures import Future
from typing import Any

from provider.daemon import Daemon
from provider.service import TaskView


async def settled_view(daemon: Daemon, key: tuple[int, int], wait: float) -> TaskView:
    """Return a task's view, first waiting up to ``wait`` seconds for its delivery.

    The view is taken after the wait: a task that finishes within it is answered with an
    ack and a receipt journaled in one commit (see :meth:`provider.service.TaskService.view`).
    """
    if wait > 0:
        future = daemon.service.future(key)
        if future is not None and not future.done():
            await wait_done(future, wait)
    return daemon.service.view(key)


async def wait_done(future: Future[Any] | asyncio.Future[Any], timeout: float) -> None:
    """Wait until a task's future is done or ``timeout`` passes (whichever first).

    Lighter than ``wait_for(shield(...))``: one loop future, one timer. A loop task's
    callback runs on the loop; a task thread's is handed over thread-safely.
    """
    loop = asyncio.get_running_loop()
    waiter: asyncio.Future[None] = loop.create_future()

    def wake() -> None:
        if not waiter.done():
            waiter.set_result(None)

    if isinstance(future, asyncio.Future):
        future.add_done_callback(lambda _: wake())
    else:
        future.add_done_callback(lambda _: loop.call_soon_threadsafe(wake))
    timer = loop.call_later(timeout, wake)
    try:
        await waiter
    finally:
        timer.cancel()
