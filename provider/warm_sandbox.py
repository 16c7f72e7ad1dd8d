"""A sandbox whose workers start on a thread while the daemon already serves.

The sandbox's workers each import JAX before they are ready: seconds, most of a daemon's
start. ``tpumarket provider run`` starts them first (:func:`start_sandbox`), before its own
imports and chain reads, and serves its API without waiting for them. Meanwhile:

- ``GET /v1/health`` answers at once, its ``warming`` list naming ``sandbox``;
- a task is checked as usual and waits for the workers after its ack, as it would wait for a
  busy pool (at most the sandbox's start timeout); so does a task recovered from the journal;
- a compile target naming a platform (``cpu``, ``tpu``, ...) is checked against the config's
  ``jax_platforms``; with no single platform configured, the workers' platform is not known
  yet and such a task is refused before its ack: ``503 overloaded`` with ``Retry-After``.

A sandbox that fails to start fails every task (``SandboxError``) and stays listed as
failed in ``/v1/health``.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from programs.envelope import ProgramEnvelope
from provider.capacity import Capacity
from provider.config import ProviderConfig
from provider.errors import RejectedError, SandboxError
from provider.sandbox import Sandbox, SandboxLimits, WorkerInfo
from provider.sandbox.envelope_checks import envelope_refusal
from provider.sandbox.targets import parse_target, platform_refusal
from provider.warmup import Warmup

PHASE = "sandbox"
RETRY_AFTER_S = 2


def build_sandbox(config: ProviderConfig) -> Sandbox:
    """Start the config's sandbox (``pool_size`` workers) and wait until each is ready; its
    spare workers, validators and spare validators as the ``sandbox_*`` keys say."""
    return Sandbox(
        config.pool_size,
        SandboxLimits(
            max_envelope_bytes=config.max_envelope_bytes,
            weak_isolation=config.sandbox_weak_isolation,
        ),
        Path(config.data_dir) / "compile-cache",
        jax_platforms=config.jax_platforms,
        spares=config.sandbox_spares,
        validators=config.sandbox_validators,
        validator_spares=config.sandbox_validator_spares,
    )


class WarmingSandbox:
    """The :class:`Sandbox` of a config, built on a thread; forwards to it once ready."""

    def __init__(
        self,
        config: ProviderConfig,
        warmup: Warmup,
        build: Callable[[ProviderConfig], Sandbox] = build_sandbox,
    ) -> None:
        """Start ``build(config)`` on a thread, as the ``sandbox`` phase of ``warmup``."""
        self._config = config
        self._build_sandbox = build
        self._ready = threading.Event()
        self._sandbox: Sandbox | None = None
        self._error: str | None = None
        self._closed = False
        self._lock = threading.Lock()
        self._wait_s = SandboxLimits().start_timeout_s * 2
        warmup.begin(PHASE)
        self._warmup = warmup
        self._thread = threading.Thread(target=self._build, name="sandbox-start", daemon=True)
        self._thread.start()

    def _build(self) -> None:
        try:
            sandbox = self._build_sandbox(self._config)
        except Exception as exc:  # reported by every task and by /v1/health
            self._error = str(exc) or type(exc).__name__
            self._warmup.end(PHASE, self._error)
            self._ready.set()
            return
        with self._lock:
            closed = self._closed
            self._sandbox = sandbox
        if closed:
            sandbox.close()
        self._warmup.end(PHASE)
        self._ready.set()

    @property
    def starting(self) -> bool:
        """Whether the workers are still starting."""
        return not self._ready.is_set()

    def wait(self, timeout_s: float | None = None) -> Sandbox:
        """Return the sandbox once its workers are ready (raise :class:`SandboxError` if
        they failed to start or are not ready within ``timeout_s``)."""
        if not self._ready.wait(self._wait_s if timeout_s is None else timeout_s):
            raise SandboxError("the sandbox's workers are still starting")
        if self._sandbox is None:
            raise SandboxError(f"the sandbox's workers failed to start: {self._error}")
        return self._sandbox

    def _refusal_while_starting(self, target: str) -> str | None:
        """Check ``target`` without the workers: by the configured platform, if single."""
        try:
            parsed = parse_target(target)
        except ValueError as exc:
            return str(exc)
        platforms = [p for p in (self._config.jax_platforms or "").split(",") if p]
        if parsed.is_aot or parsed.name == "local":
            return None
        if len(platforms) == 1:
            return platform_refusal(parsed, platforms[0])
        raise RejectedError(
            "overloaded",
            "the provider is starting: its sandbox workers are not ready yet, and only they "
            f"know this host's platform; retry after {RETRY_AFTER_S} s",
        )

    # ---- what the daemon, its service and its API call ------------------------------

    @property
    def isolation(self) -> str:
        """The sandbox's isolation mode (``starting`` while the workers start)."""
        return "starting" if self.starting or self._sandbox is None else self._sandbox.isolation

    def workers(self) -> list[WorkerInfo]:
        """The live workers (none while they start)."""
        return [] if self.starting or self._sandbox is None else self._sandbox.workers()

    def target_refusal(self, target: str) -> str | None:
        """Say why this host cannot compile for ``target`` (see the module docstring for
        the check while the workers start)."""
        if self.starting:
            return self._refusal_while_starting(target)
        return self.wait().target_refusal(target)

    def envelope_refusal(self, envelope: ProgramEnvelope, target: str | None) -> Any:
        """Say (code, reason) why a worker would refuse ``envelope``; while the workers start,
        only what needs no worker is checked (the platform by the configured one)."""
        if not self.starting:
            return self.wait().envelope_refusal(envelope, target)
        if target is not None and parse_target(target).is_aot:
            platform: str | None = "tpu"
        else:
            platforms = [p for p in (self._config.jax_platforms or "").split(",") if p]
            platform = platforms[0] if len(platforms) == 1 else None
        return envelope_refusal(envelope, platform, None)

    def compile(self, *args: Any, **kwargs: Any) -> Any:
        """Compile in the sandbox (waiting for its workers)."""
        return self.wait().compile(*args, **kwargs)

    def run(self, *args: Any, **kwargs: Any) -> Any:
        """Run in the sandbox (waiting for its workers)."""
        return self.wait().run(*args, **kwargs)

    async def run_async(self, *args: Any, **kwargs: Any) -> Any:
        """Run in the sandbox (waiting for its workers off the event loop)."""
        sandbox = self.wait(0) if not self.starting else await asyncio.to_thread(self.wait)
        return await sandbox.run_async(*args, **kwargs)

    def capacity(self, **kwargs: Any) -> Capacity:
        """Measure the host in the sandbox (waiting for its workers)."""
        return self.wait().capacity(**kwargs)

    def close(self) -> None:
        """Stop the workers (a sandbox still starting is stopped once it is up)."""
        with self._lock:
            self._closed = True
            sandbox = self._sandbox
        if sandbox is not None:
            sandbox.close()

    def __getattr__(self, name: str) -> Any:
        """Forward anything else to the sandbox once its workers are up; refused (503) while
        they start, never waited for (a caller may be the API's event loop)."""
        if name.startswith("_"):
            raise AttributeError(name)
        if self.starting:
            raise RejectedError(
                "overloaded",
                f"the provider is starting: its sandbox workers are not ready yet; retry after "
                f"{RETRY_AFTER_S} s",
            )
        return getattr(self.wait(), name)
