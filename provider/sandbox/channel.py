"""Framed, non-blocking exchanges with a worker's pipe, driven by the event loop.

The worker keeps its blocking :class:`multiprocessing.connection.Connection`; the parent's
end is read and written here without a thread: the pipe's descriptor is switched to
non-blocking for the length of one borrow, watched with ``add_reader``/``add_writer``, and
frames are cut with the same length prefix that ``Connection.send_bytes`` writes (``!i``
size, or ``-1`` then ``!Q`` size for frames of 2 GiB and more). A worker that stops
mid-frame only stalls its own task until the stage deadline, never the loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import struct
from multiprocessing.connection import Connection

from provider.sandbox.wire import FrameError

_SIZE = struct.Struct("!i")
_LONG = struct.Struct("!Q")
_READ_CHUNK = 1 << 20


def frame_prefix(size: int) -> bytes:
    """Return the length prefix ``Connection.send_bytes`` writes before ``size`` bytes."""
    if size > 0x7FFFFFFF:
        return _SIZE.pack(-1) + _LONG.pack(size)
    return _SIZE.pack(size)


class PipeChannel:
    """One borrow of a worker's pipe by the event loop: send frames, receive frames.

    Use as a context manager; leaving it unregisters the descriptor and makes it blocking
    again, so the pool's thread path can use the same connection afterwards.
    """

    def __init__(self, conn: Connection, max_frame: int) -> None:
        """Borrow ``conn``'s descriptor; frames above ``max_frame`` bytes are refused."""
        self._loop = asyncio.get_running_loop()
        self._fd = conn.fileno()
        self._max_frame = max_frame
        self._buffer = bytearray()
        self._waiter: asyncio.Future[None] | None = None
        self._reading = False
        self._writing = False

    def __enter__(self) -> PipeChannel:
        """Switch the descriptor to non-blocking."""
        os.set_blocking(self._fd, False)
        return self

    def __exit__(self, *_: object) -> None:
        """Stop watching the descriptor and make it blocking again."""
        self._unwatch()
        with contextlib.suppress(OSError):  # already closed by a kill
            os.set_blocking(self._fd, True)

    @property
    def leftover(self) -> int:
        """Return how many received bytes were not consumed by a frame."""
        return len(self._buffer)

    # ---- sending -----------------------------------------------------------------------

    async def send(self, data: bytes, deadline: float) -> None:
        """Write one frame; raise TimeoutError past ``deadline`` (loop time), OSError if closed.

        Prefix and data go in one ``writev``: one wake-up of the worker, not one per part.
        """
        parts = [memoryview(frame_prefix(len(data))), memoryview(data)]
        while parts:
            try:
                written = os.writev(self._fd, parts)
            except BlockingIOError:
                await self._wait(deadline, write=True)
                continue
            while parts and written >= len(parts[0]):
                written -= len(parts.pop(0))
            if parts and written:
                parts[0] = parts[0][written:]

    # ---- receiving ---------------------------------------------------------------------

    async def recv(self, deadline: float) -> bytes:
        """Read one frame; raise TimeoutError past ``deadline``, EOFError/OSError if closed,
        :class:`FrameError` if the worker announces a frame above the cap."""
        while True:
            frame = self._take()
            if frame is not None:
                return frame
            try:
                chunk = os.read(self._fd, _READ_CHUNK)
            except BlockingIOError:
                await self._wait(deadline, write=False)
                continue
            if not chunk:
                raise EOFError("the worker closed its pipe")
            self._buffer += chunk

    def _take(self) -> bytes | None:
        buffer = self._buffer
        if len(buffer) < _SIZE.size:
            return None
        (size,) = _SIZE.unpack_from(buffer)
        start = _SIZE.size
        if size == -1:
            if len(buffer) < _SIZE.size + _LONG.size:
                return None
            (size,) = _LONG.unpack_from(buffer, _SIZE.size)
            start += _LONG.size
        if size < 0 or size > self._max_frame:
            raise FrameError(f"frame of {size} bytes above the cap {self._max_frame}")
        end = start + size
        if len(buffer) < end:
            return None
        frame = bytes(buffer[start:end])
        del buffer[:end]
        return frame

    # ---- readiness ---------------------------------------------------------------------

    async def _wait(self, deadline: float, *, write: bool) -> None:
        """Wait until the descriptor is readable (writable) or raise TimeoutError."""
        loop = self._loop
        if loop.time() >= deadline:
            raise TimeoutError
        waiter: asyncio.Future[None] = loop.create_future()
        self._waiter = waiter
        if write and not self._writing:
            loop.add_writer(self._fd, self._wake)
            self._writing = True
        elif not write and not self._reading:
            loop.add_reader(self._fd, self._wake)
            self._reading = True
        timer = loop.call_at(deadline, self._expire, waiter)
        try:
            await waiter
        finally:
            timer.cancel()
            self._waiter = None
            self._unwatch()  # level-triggered: a watched, unread descriptor would spin

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    @staticmethod
    def _expire(waiter: asyncio.Future[None]) -> None:
        if not waiter.done():
            waiter.set_exception(TimeoutError())

    def _unwatch(self) -> None:
        if self._reading:
            self._loop.remove_reader(self._fd)
            self._reading = False
        if self._writing:
            self._loop.remove_writer(self._fd)
            self._writing = False
