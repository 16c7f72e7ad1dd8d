"""The on-disk cache of ahead-of-time compile reports (memory, cost, available bytes)."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any, TypedDict

from provider.sandbox.targets import kind_slug


class AotReport(TypedDict):
    """The figures of one ahead-of-time compile."""

    memory: dict[str, int] | None
    cost: dict[str, float] | None
    available_bytes: int | None


def report_path(cache_root: Path | None, key: tuple[Any, ...], kind: str) -> Path | None:
    """Where the report for compile ``key`` on device ``kind`` lives; None without a cache."""
    if cache_root is None:
        return None
    digest = hashlib.sha256(json.dumps([repr(k) for k in key]).encode()).hexdigest()
    return cache_root / kind_slug(kind) / "aot-reports" / f"{digest}.json"


def read_report(path: Path) -> AotReport | None:
    """The report stored at ``path``, or None when there is none."""
    if not path.exists():
        return None
    report = json.loads(path.read_text())
    return {
        "memory": report["memory"],
        "cost": report["cost"],
        "available_bytes": report["available_bytes"],
    }


def write_report(path: Path, report: AotReport) -> None:
    """Store ``report`` at ``path`` atomically (write a temporary file, then rename)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(report))
    tmp.replace(path)
