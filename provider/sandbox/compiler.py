"""The worker that compiles for TPU topologies ahead of time, apart from the executing ones.

Compiling for a TPU target loads libtpu into the process (~0.1-0.9 GB resident, more after
real compiles) and it never unloads. On a host without TPU chips, those compiles (and the
capacity probe of the compile targets) go to a dedicated pool started on first use, so the
workers that run inference never carry libtpu. On a TPU host the executing workers hold
libtpu anyway, and compile there.
"""

from __future__ import annotations

import threading
from typing import Final

from provider.errors import SandboxClosedError
from provider.sandbox.fair import FairGate
from provider.sandbox.limits import SandboxLimits
from provider.sandbox.pool import WorkerPool

AOT_ENV: Final = {
    "JAX_PLATFORMS": "cpu",
    # libtpu only compiles here and opens no chip, so it may load beside other processes.
    "ALLOW_MULTIPLE_LIBTPU_LOAD": "1",
    # Without chips libtpu looks for TPU workers and logs E0000 lines when it finds none.
    "TPU_WORKER_HOSTNAMES": "localhost",
    "TPU_SKIP_MDS_QUERY": "1",
}
"""What a compiler worker's environment adds (see :func:`provider.sandbox.isolation.worker_env`)."""


class CompilerPool:
    """One compiler worker (and no spare), started when the first AOT compile needs it."""

    def __init__(self, limits: SandboxLimits, env: dict[str, str], module: str) -> None:
        """Start workers with ``limits`` (no warm-up compile) and the whole ``env``."""
        self.limits = limits
        self._env = env
        self._module = module
        self._lock = threading.Lock()
        self._pool: WorkerPool | None = None
        self._closed = False
        self.gate = FairGate(1, 1)

    def pool(self) -> WorkerPool:
        """Return the compiler pool, starting it on first use (the caller waits)."""
        with self._lock:
            if self._closed:
                raise SandboxClosedError("the sandbox is closed")
            if self._pool is None:
                self._pool = WorkerPool(
                    1, self.limits, None, self._env, module=self._module, spares=0
                )
            return self._pool

    @property
    def started(self) -> WorkerPool | None:
        """The pool if it was started."""
        return self._pool

    def close(self) -> None:
        """Stop the compiler worker; later calls raise :class:`SandboxClosedError`."""
        with self._lock:
            self._closed = True
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.close()
