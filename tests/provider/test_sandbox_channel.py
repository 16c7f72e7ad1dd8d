"""The event loop's framed, non-blocking reads and writes on a worker's pipe."""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import threading

import pytest

from provider.sandbox.channel import PipeChannel
from provider.sandbox.wire import FrameError

BIG = os.urandom(5 << 20)  # larger than any socket buffer: many partial reads and writes


def test_channel_when_frames_cross_the_buffer_then_both_ends_agree_with_connection() -> None:
    ours, theirs = multiprocessing.Pipe(duplex=True)
    echoed: list[bytes] = []

    def peer() -> None:  # a worker's side: blocking Connection calls
        for _ in range(3):
            frame = theirs.recv_bytes()
            echoed.append(frame)
            theirs.send_bytes(frame[::-1])

    thread = threading.Thread(target=peer)
    thread.start()

    async def exchange() -> list[bytes]:
        loop = asyncio.get_running_loop()
        with PipeChannel(ours, len(BIG)) as pipe:
            replies = []
            for frame in (b"", b"x" * 20_000, BIG):
                await pipe.send(frame, loop.time() + 60)
                replies.append(await pipe.recv(loop.time() + 60))
            assert pipe.leftover == 0
            return replies

    replies = asyncio.run(exchange())
    thread.join()
    assert echoed == [b"", b"x" * 20_000, BIG]
    assert replies == [b"", b"x" * 20_000, BIG[::-1]]
    assert os.get_blocking(ours.fileno())  # handed back blocking to the thread path
    ours.send_bytes(b"again")
    assert theirs.recv_bytes() == b"again"


def test_channel_when_nothing_arrives_by_the_deadline_then_timeout() -> None:
    ours, _theirs = multiprocessing.Pipe(duplex=True)

    async def wait() -> None:
        loop = asyncio.get_running_loop()
        with PipeChannel(ours, 1024) as pipe:
            await pipe.recv(loop.time() + 0.05)

    with pytest.raises(TimeoutError):
        asyncio.run(wait())


def test_channel_when_the_peer_announces_an_oversized_frame_then_frame_error() -> None:
    ours, theirs = multiprocessing.Pipe(duplex=True)
    theirs.send_bytes(b"y" * 2048)

    async def read() -> bytes:
        loop = asyncio.get_running_loop()
        with PipeChannel(ours, 1024) as pipe:
            return await pipe.recv(loop.time() + 60)

    with pytest.raises(FrameError):
        asyncio.run(read())


def test_channel_when_the_peer_closes_then_eof() -> None:
    ours, theirs = multiprocessing.Pipe(duplex=True)
    theirs.close()

    async def read() -> bytes:
        loop = asyncio.get_running_loop()
        with PipeChannel(ours, 1024) as pipe:
            return await pipe.recv(loop.time() + 60)

    with pytest.raises(EOFError):
        asyncio.run(read())
