"""Ahead-of-time compile reports (memory, cost, available bytes), as the daemon keeps them.

A report is served as a cache hit (and signed in a receipt) only from the daemon's own store,
under the client whose worker produced it (:class:`provider.sandbox.compile_store.CompileStore`):
no worker reads or writes a report file.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, TypedDict


class AotReport(TypedDict):
    """The figures of one ahead-of-time compile, and where they were compiled."""

    memory: dict[str, int] | None
    cost: dict[str, float] | None
    available_bytes: int | None
    platform: str
    device_kind: str


def report_digest(key: tuple[Any, ...]) -> str:
    """The file name (hex digest) of the report for compile ``key``."""
    return hashlib.sha256(json.dumps([repr(k) for k in key]).encode()).hexdigest()


def parse_report(text: str) -> AotReport | None:
    """A stored report, or None when the text is not one."""
    try:
        report = json.loads(text)
        return {
            "memory": report["memory"],
            "cost": report["cost"],
            "available_bytes": report["available_bytes"],
            "platform": str(report["platform"]),
            "device_kind": str(report["device_kind"]),
        }
    except (ValueError, KeyError, TypeError):
        return None
