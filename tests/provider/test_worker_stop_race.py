"""A sandbox worker stopped by several of the pool's threads at once (its close racing a
recycle): each stop returns, the worker is gone, and its pipe is closed once (a second close of
a reused descriptor number would close another worker's pipe)."""

from __future__ import annotations

import threading

from provider.sandbox import SandboxLimits
from provider.sandbox.worker_process import WorkerProcess


def test_stop_when_threads_race_to_stop_one_worker_then_each_returns_and_it_is_gone() -> None:
    for _ in range(50):  # the race is not met every time
        _race_to_stop()


def _race_to_stop() -> None:
    worker = WorkerProcess(SandboxLimits(), None, {"JAX_PLATFORMS": "cpu"})
    errors: list[BaseException] = []
    start = threading.Barrier(8)

    def stop() -> None:
        start.wait()
        try:
            worker.stop()
        except BaseException as exc:  # what the race raised before
            errors.append(exc)

    threads = [threading.Thread(target=stop) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert not worker.process.is_alive() and worker.conn.closed
