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


class ConfigError(ProviderError, ValueError):
    """Raised when the daemon's configuration is missing, unreadable or inconsistent."""


class JournalError(ProviderError):
    """Raised when the journal cannot be opened or written."""


class JournalCorruptError(JournalError):
    """Raised when the journal's receipt chain or signatures do not verify on startup."""


class RejectedError(ProviderError):
    """A task or voucher the daemon refuses; ``code`` names the reason for the client.

    The API maps each code to one HTTP status (see ``provider.api.errors``).
    """

    def __init__(self, code: str, reason: str) -> None:
        """Carry a stable machine-readable ``code`` and a human-readable ``reason``."""
        super().__init__(f"{code}: {reason}")
        self.code = code
        self.reason = reason


class NotFoundError(ProviderError, LookupError):
    """Raised when a task or deal the caller names is not in the journal."""


class SettlementError(ProviderError):
    """Raised when a settlement job cannot reach the chain or its transaction fails."""
