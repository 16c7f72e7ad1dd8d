"""Exception root of the provider package."""

from __future__ import annotations


class ProviderError(Exception):
    """Root of every error the provider package raises on purpose."""


class SandboxError(ProviderError):
    """Raised when the sandbox itself cannot serve (closed pool, worker start failure)."""


class SandboxClosedError(SandboxError, RuntimeError):
    """Raised when a task is submitted to a sandbox that was closed."""


class WorkerStartError(SandboxError, RuntimeError):
    """Raised when a worker process does not come up in time."""


class CapacityError(ProviderError, RuntimeError):
    """Raised when device discovery or the self-benchmark fails."""
