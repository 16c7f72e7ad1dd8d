"""The demo's one error."""

from __future__ import annotations

from client.errors import ClientError


class DemoError(ClientError, RuntimeError):
    """The demo could not run to its end (a process died, a step timed out)."""
