"""Long-polling a task until it is delivered, without a thread per waiter."""

from __future__ import annotations

import asyncio
from concurrent.futures import Future
from typing import Any

from provider.daemon import Daemon
from provider.service import TaskView


async def settled_view(daemon: Daemon, key: tuple[int, int], wait: float) -> TaskView:
    """Return a task's view, first waiting up to ``wait`` seconds for its delivery."""
    view = daemon.service.view(key)
    if view.receipt is None and wait > 0:
        future = daemon.service.future(key)
        if future is not None:
            await wait_done(future, wait)
            view = daemon.service.view(key)
    return view


async def wait_done(future: Future[Any], timeout: float) -> None:
    """Wait until a task thread's future is done or ``timeout`` passes (whichever first).

    Lighter than ``wait_for(shield(wrap_future(...)))``: one loop future, one timer.
    """
    loop = asyncio.get_running_loop()
    waiter: asyncio.Future[None] = loop.create_future()

    def wake() -> None:
        if not waiter.done():
            waiter.set_result(None)

    future.add_done_callback(lambda _: loop.call_soon_threadsafe(wake))
    timer = loop.call_later(timeout, wake)
    try:
        await waiter
    finally:
        timer.cancel()
