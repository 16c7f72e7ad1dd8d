"""The order test files run in: costliest first, from the seconds each took in a measured run.

With several workers (`make test`: pytest-xdist, one file per worker at a time) the run ends
when its last file does; a file of one long scenario taken last keeps the whole run waiting
while the other workers idle. So files are handed out longest first (`tests/file_seconds.json`,
written by `scripts/test-file-seconds` from a run's JUnit report), each file's tests in their
own order. A file the table does not list counts as the table's median. The order depends only
on the table and the collected tests, so every worker collects the same list.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TABLE = Path(__file__).resolve().parent / "file_seconds.json"


def file_seconds(table: Path = TABLE) -> dict[str, float]:
    """Return the measured seconds of each test file (path from the repository root)."""
    if not table.exists():
        return {}
    data = json.loads(table.read_text())
    return {str(name): float(seconds) for name, seconds in data["files"].items()}


def costliest_first(items: list[pytest.Item], seconds: dict[str, float]) -> list[pytest.Item]:
    """Return `items` grouped by file, files by their seconds, most first (unlisted: the
    median), ties by path; each file's tests in their collected order."""
    by_file: dict[str, list[pytest.Item]] = {}
    for item in items:
        by_file.setdefault(_relative(item.path), []).append(item)
    default = statistics.median(seconds.values()) if seconds else 0.0
    order = sorted(by_file, key=lambda name: (-seconds.get(name, default), name))
    return [item for name in order for item in by_file[name]]


def _relative(path: Path) -> str:
    try:
        return path.resolve().relative_to(ROOT).as_posix()
    except ValueError:
        return path.as_posix()
