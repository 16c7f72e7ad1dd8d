"""The arbiter's typed refusals."""

from __future__ import annotations

from provider.errors import ProviderError


class ArbiterError(ProviderError):
    """Raised by the arbiter."""


class EvidenceRefused(ArbiterError):
    """An upload the arbiter does not take: an HTTP status, a stable code and a reason."""

    def __init__(self, status: int, code: str, reason: str) -> None:
        """Refuse with ``status`` (4xx), ``code`` and ``reason``."""
        super().__init__(f"{code}: {reason}")
        self.status = status
        self.code = code
        self.reason = reason
