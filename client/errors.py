"""The client SDK's exception root and its families."""

from __future__ import annotations


class ClientError(Exception):
    """Root of every error raised by the `client` package."""


class DeliveryRejected(ClientError, ValueError):
    """A provider's delivery failed verification and must not be paid."""

    def __init__(self, task_index: int, reason: str) -> None:
        self.task_index = task_index
        self.reason = reason
        super().__init__(f"task {task_index}: {reason}")


class SpendingCapExceeded(ClientError):
    """Paying would take a deal or the client past its spending cap."""
