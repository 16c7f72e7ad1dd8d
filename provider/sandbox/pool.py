"""A pool of spawned, long-lived worker processes with parent-enforced hard timeouts."""

from __future__ import annotations

import asyncio
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from provider.diagnosis import Diagnosis, Stage, crash, timeout
from provider.errors import SandboxClosedError, WorkerStartError
from provider.sandbox.channel import PipeChannel
from provider.sandbox.limits import SandboxLimits
from provider.sandbox.stages import StageClock
from provider.sandbox.wire import FrameError, Header, pack, unpack
from provider.sandbox.worker_process import (
    FRAME_OVERHEAD,
    WORKER_MODULE,
    WorkerInfo,
    WorkerProcess,
)

StageObserver = Callable[[int, Stage], None]
_CLOSE_CHECK_S = 1.0  # how often a caller waiting for a worker notices close()


@dataclass(frozen=True, slots=True)
class WarmCall:
    """A shorter request for a worker that already ran the same program and weights.

    ``key`` names (program, weights); a worker that answers ``miss`` gets the full request.
    """

    key: bytes
    request: Header
    payload: bytes


class WorkerPool:
    """Spawned workers kept alive between tasks; a crashed or overdue worker is replaced.

    Thread-safe: a caller borrows an idle worker for one task and gives it back. Threads
    call :meth:`call`; an event loop calls :meth:`call_async`, which talks to the worker's
    pipe from the loop itself (no thread hop) under the same stage deadlines.
    """

    def __init__(
        self,
        size: int,
        limits: SandboxLimits,
        cache_root: Path | None,
        env: dict[str, str],
        on_stage: StageObserver | None = None,
        *,
        module: str = WORKER_MODULE,
        spares: int | None = None,
    ) -> None:
        """Spawn ``size`` workers and wait until each has imported JAX.

        ``env`` is each worker's whole environment (see
        :func:`provider.sandbox.isolation.worker_env`); ``module`` its entry point.
        ``spares`` more workers start in the background once those are ready (default: enough
        that 3 are ready in all), so that a worker retired after a malformed program is
        replaced by a ready one at once: a replacement that is still starting is never handed
        to a task while a ready worker exists.
        """
        if size < 1:
            raise ValueError("pool size must be at least 1")
        self.limits = limits
        self._cache_root = cache_root
        self._env = dict(env)
        self._module = module
        self._on_stage = on_stage
        self._idle: queue.Queue[WorkerProcess] = queue.Queue()
        self._lock = threading.Lock()
        self._all: set[WorkerProcess] = set()
        self._closed = False
        self._waiters: ThreadPoolExecutor | None = None  # async callers waiting for a worker
        self.replacements = 0
        self.stretched = 0  # stage limits moved to the task's budget: the worker was starved
        self.start_waits = 0  # tasks that found no ready worker while replacements started
        self._spawner = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sandbox-spawn")
        self._starting = 0  # workers spawned and not yet ready, outside the idle queue
        self._start_failure: WorkerStartError | None = None
        workers = [self._spawn() for _ in range(size)]
        for worker in workers:
            worker.wait_ready(limits.start_timeout_s)
            self._idle.put(worker)
        for _ in range(max(0, 3 - size) if spares is None else spares):
            self._start_in_background()

    def _start_in_background(self) -> None:
        """Spawn a worker and add it to the idle queue only once it is ready."""
        with self._lock:
            if self._closed:
                return
            self._starting += 1
        threading.Thread(target=self._bring_up, daemon=True).start()

    def _bring_up(self) -> None:
        try:
            worker = self._spawn()
            worker.wait_ready(self.limits.start_timeout_s)
        except WorkerStartError as exc:
            with self._lock:
                self._starting -= 1
                self._start_failure = exc
            return
        with self._lock:
            self._starting -= 1
            closed = self._closed
        if closed:
            self._stop(worker)
            return
        self._idle.put(worker)

    def _spawn(self) -> WorkerProcess:
        try:
            # One long-lived thread starts every worker: the launcher's parent-death signal
            # (bwrap --die-with-parent) follows the thread that forked it, not the process.
            worker = self._spawner.submit(
                WorkerProcess, self.limits, self._cache_root, self._env, self._module
            ).result()
        except WorkerStartError:  # refused before it started (one it cannot isolate)
            raise
        except RuntimeError as exc:  # the spawner is shut down: the pool is closing
            raise WorkerStartError("the sandbox is closing") from exc
        except OSError as exc:
            raise WorkerStartError(f"cannot spawn a sandbox worker: {exc}") from exc
        with self._lock:
            self._all.add(worker)
        return worker

    def _retire(self, worker: WorkerProcess, *, kill: bool) -> None:
        if kill:
            worker.kill()
        else:
            worker.stop()
        with self._lock:
            self._all.discard(worker)
            closed = self._closed
            if not closed:
                self.replacements += 1
        if not closed:
            self._start_in_background()

    def ready_count(self) -> int:
        """Return how many workers are started (busy or idle)."""
        with self._lock:
            return sum(1 for w in self._all if w.info is not None)

    def worker_infos(self) -> list[WorkerInfo]:
        """Return what each started worker reported (workers still starting are left out)."""
        with self._lock:
            return [w.info for w in self._all if w.info is not None]

    def _acquire(self) -> WorkerProcess:
        if self._idle.empty():
            with self._lock:
                if self._starting:
                    self.start_waits += 1  # no ready worker while some are starting
        while True:
            if self._closed:
                raise SandboxClosedError("the sandbox is closed")
            try:
                worker = self._idle.get(timeout=_CLOSE_CHECK_S)
            except queue.Empty:
                with self._lock:
                    failure = self._start_failure if self._starting == 0 else None
                    self._start_failure = None if failure is not None else self._start_failure
                if failure is not None:
                    self._start_in_background()  # keep the pool at size for the next caller
                    raise failure from None
                continue
            if worker.superseded:
                threading.Thread(target=self._stop, args=(worker,), daemon=True).start()
                continue
            if not worker.process.is_alive() and worker.info is not None:
                self._retire(worker, kill=True)
                continue
            try:
                worker.wait_ready(self.limits.start_timeout_s)
            except WorkerStartError:
                self._retire(worker, kill=True)  # keep the pool at size for the next caller
                raise
            return worker

    def _acquire_nowait(self) -> WorkerProcess | None:
        """Return an idle, started, live worker at once, or None (then wait in a thread)."""
        if self._closed:
            raise SandboxClosedError("the sandbox is closed")
        try:
            worker = self._idle.get_nowait()
        except queue.Empty:
            return None
        if worker.info is None or worker.superseded or not worker.process.is_alive():
            self._idle.put(worker)  # starting, retiring or dead: the blocking path handles it
            return None
        return worker

    async def _acquire_async(self) -> WorkerProcess:
        """Borrow a worker; only when none is idle does a helper thread wait for one."""
        worker = self._acquire_nowait()
        if worker is not None:
            return worker
        with self._lock:
            if self._waiters is None:
                self._waiters = ThreadPoolExecutor(
                    max_workers=max(1, len(self._all)), thread_name_prefix="sandbox-wait"
                )
            waiters = self._waiters
        pending = waiters.submit(self._acquire)
        try:
            return await asyncio.wrap_future(pending)
        except asyncio.CancelledError:
            pending.add_done_callback(self._give_back)
            raise

    def _prefer(self, worker: WorkerProcess, key: bytes | None) -> WorkerProcess:
        """Swap ``worker`` for an idle one that suits the task better, if there is one.

        A task whose program a worker already ran goes to that worker (the warm path); any
        other task, a malformed one included, goes to the worker with the fewest warm
        programs, so that retiring it costs the other clients no warm worker.
        """
        others: list[WorkerProcess] = []
        while True:
            try:
                others.append(self._idle.get_nowait())
            except queue.Empty:
                break
        if not others:
            return worker
        candidates = [worker, *others]
        if key is not None and key in worker.warm:
            best = worker
        elif key is not None and any(key in w.warm for w in others):
            best = next(w for w in others if key in w.warm)
        else:
            best = min(candidates, key=lambda w: len(w.warm))
        for other in candidates:
            if other is not best:
                self._idle.put(other)
        return best

    def _give_back(self, acquired: Future[WorkerProcess]) -> None:
        if not acquired.cancelled() and acquired.exception() is None:
            self._idle.put(acquired.result())

    def _stop(self, worker: WorkerProcess) -> None:
        worker.stop()
        with self._lock:
            self._all.discard(worker)

    def call(
        self,
        request: Header,
        payload: bytes,
        *,
        warm: WarmCall | None = None,
        budget_s: float | None = None,
    ) -> tuple[Header, bytes] | Diagnosis:
        """Run one request on a worker; return its reply, or a diagnosis if it died or hung.

        With ``warm``, a worker that ran the same program and weights gets the shorter
        request (execute deadline only); on a ``miss`` it gets the full one. ``budget_s``
        bounds the whole call once a worker is borrowed: every stage's deadline is cut to
        it, and a worker still busy at the budget is killed (its stage's timeout).
        """
        worker = self._prefer(self._acquire(), None if warm is None else warm.key)
        cutoff = None if budget_s is None else time.monotonic() + budget_s
        if warm is not None and warm.key in worker.warm:
            reply = self._exchange(worker, warm.request, warm.payload, Stage.EXECUTE, cutoff)
            if isinstance(reply, Diagnosis) or reply[0].get("type") != "miss":
                return self._finish(worker, reply)
            worker.warm.discard(warm.key)
        reply = self._exchange(worker, request, payload, Stage.PARSE, cutoff)
        if warm is not None and not isinstance(reply, Diagnosis) and reply[0].get("warm"):
            worker.warm.add(warm.key)
        return self._finish(worker, reply)

    async def call_async(
        self,
        request: Header,
        payload: bytes,
        *,
        warm: WarmCall | None = None,
        budget_s: float | None = None,
    ) -> tuple[Header, bytes] | Diagnosis:
        """:meth:`call` for an event loop: the loop reads and writes the worker's pipe."""
        worker = self._prefer(await self._acquire_async(), None if warm is None else warm.key)
        cutoff = None if budget_s is None else time.monotonic() + budget_s
        if warm is not None and warm.key in worker.warm:
            reply = await self._exchange_async(
                worker, warm.request, warm.payload, Stage.EXECUTE, cutoff
            )
            if isinstance(reply, Diagnosis) or reply[0].get("type") != "miss":
                return self._finish(worker, reply)
            worker.warm.discard(warm.key)
        reply = await self._exchange_async(worker, request, payload, Stage.PARSE, cutoff)
        if warm is not None and not isinstance(reply, Diagnosis) and reply[0].get("warm"):
            worker.warm.add(warm.key)
        return self._finish(worker, reply)

    async def _exchange_async(
        self,
        worker: WorkerProcess,
        request: Header,
        payload: bytes,
        stage: Stage,
        cutoff: float | None = None,
    ) -> tuple[Header, bytes] | Diagnosis:
        """:meth:`_exchange` on the event loop, with the same deadlines and outcomes.

        A crash or timeout kills and replaces the worker on the loop (a process spawn, a few
        milliseconds, only on that rare path). A cancelled caller (shutdown) kills the worker:
        its state mid-task is unknown.
        """
        outcome: tuple[Header, bytes] | Diagnosis | None = None
        try:
            with PipeChannel(worker.conn, self.limits.max_output_bytes + FRAME_OVERHEAD) as pipe:
                outcome = await self._converse(worker, pipe, request, payload, stage, cutoff)
        finally:
            if outcome is None or isinstance(outcome, Diagnosis):
                self._retire(worker, kill=True)  # after the pipe is released
        return outcome

    async def _converse(
        self,
        worker: WorkerProcess,
        pipe: PipeChannel,
        request: Header,
        payload: bytes,
        stage: Stage,
        cutoff: float | None = None,
    ) -> tuple[Header, bytes] | Diagnosis:
        """Send one request and follow the stage reports; a diagnosis means: retire it."""
        loop = asyncio.get_running_loop()
        clock = StageClock(self.limits, stage, cutoff, loop.time(), worker.process.pid)
        try:
            await pipe.send(pack(request, payload), clock.deadline)
        except TimeoutError:
            return timeout(stage, clock.limit)
        except OSError:
            return crash(stage, worker.process.exitcode)
        while True:
            try:
                header, body = unpack(await pipe.recv(clock.deadline))
            except TimeoutError:
                if not clock.overrun(loop.time()):
                    self.stretched += 1
                    continue
                return timeout(clock.stage, clock.limit)
            except FrameError:
                return crash(stage, None)
            except (EOFError, OSError):
                worker.process.join(10)  # its pipe closed: it is exiting
                return crash(stage, worker.process.exitcode)
            if header.get("type") != "stage":
                if pipe.leftover:  # nothing may follow a reply: the worker is out of step
                    return crash(stage, None)
                return header, body
            try:
                new_stage = Stage(str(header.get("stage")))
            except ValueError:
                return crash(clock.stage, None)
            clock.enter(new_stage, loop.time())
            stage = new_stage
            if self._on_stage is not None and worker.info is not None:
                self._on_stage(worker.info.pid, stage)

    def _exchange(
        self,
        worker: WorkerProcess,
        request: Header,
        payload: bytes,
        stage: Stage,
        cutoff: float | None = None,
    ) -> tuple[Header, bytes] | Diagnosis:
        """Send one request; follow the worker's stage reports under each stage's deadline."""
        clock = StageClock(self.limits, stage, cutoff, time.monotonic(), worker.process.pid)
        try:
            worker.conn.send_bytes(pack(request, payload))
        except OSError:
            self._retire(worker, kill=True)
            return crash(stage, worker.process.exitcode)
        max_frame = self.limits.max_output_bytes + FRAME_OVERHEAD
        while True:
            remaining = clock.deadline - time.monotonic()
            if remaining <= 0 or not worker.conn.poll(remaining):
                if not clock.overrun(time.monotonic()):
                    self.stretched += 1  # starved by the host's load: on to the budget
                    continue
                self._retire(worker, kill=True)
                return timeout(stage, clock.limit)
            try:
                header, body = unpack(worker.conn.recv_bytes(max_frame))
            except (EOFError, OSError, FrameError):
                worker.process.join(10)
                exitcode = worker.process.exitcode
                self._retire(worker, kill=True)
                return crash(stage, exitcode)
            if header.get("type") != "stage":
                return header, body
            try:
                new_stage = Stage(str(header.get("stage")))
            except ValueError:
                self._retire(worker, kill=True)
                return crash(stage, None)
            clock.enter(new_stage, time.monotonic())
            stage = new_stage
            if self._on_stage is not None and worker.info is not None:
                self._on_stage(worker.info.pid, stage)

    def _finish(
        self, worker: WorkerProcess, reply: tuple[Header, bytes] | Diagnosis
    ) -> tuple[Header, bytes] | Diagnosis:
        """Give a worker that answered back to the pool, or recycle it."""
        if isinstance(reply, Diagnosis):
            return reply  # the worker was killed and replaced
        worker.tasks += 1
        if reply[0].get("recycle"):
            with self._lock:
                self._all.discard(worker)
                closed = self._closed
                if not closed:
                    self.replacements += 1
            threading.Thread(target=worker.stop, daemon=True).start()
            if not closed:
                self._start_in_background()
            return reply
        self._idle.put(worker)
        if worker.tasks == self.limits.max_tasks_per_worker:
            threading.Thread(target=self._succeed, args=(worker,), daemon=True).start()
        return reply

    def _succeed(self, worker: WorkerProcess) -> None:
        """Planned recycle: the old worker serves until its successor is ready."""
        if self._closed:
            return
        try:
            successor = self._spawn()
        except WorkerStartError:
            worker.tasks = 0  # keep the old one; try again after as many tasks
            return
        try:
            successor.wait_ready(self.limits.start_timeout_s)
        except WorkerStartError:
            self._stop(successor)
            worker.tasks = 0
            return
        with self._lock:
            closed = self._closed
            if not closed:
                self.replacements += 1
        if closed:
            self._stop(successor)
            return
        worker.superseded = True
        self._idle.put(successor)

    def close(self) -> None:
        """Stop every worker; later calls raise :class:`SandboxClosedError`."""
        with self._lock:
            self._closed = True
            workers = list(self._all)
            self._all.clear()
            waiters, self._waiters = self._waiters, None
        for worker in workers:
            worker.stop()
        self._spawner.shutdown(wait=False)
        if waiters is not None:
            waiters.shutdown(wait=False, cancel_futures=True)
