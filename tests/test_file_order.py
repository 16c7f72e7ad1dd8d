"""Test files run costliest first (`tests.file_order`), each file's tests in their order, and
the measured table names only files that exist."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.file_order import ROOT, costliest_first, file_seconds


class Item:
    """A collected test as the ordering sees it: its file."""

    def __init__(self, path: str, name: str) -> None:
        self.path = ROOT / path
        self.name = name


def _order(items: list[Item], seconds: dict[str, float]) -> list[str]:
    ordered: list[Any] = costliest_first(items, seconds)  # type: ignore[arg-type]
    return [f"{Path(i.path).name}:{i.name}" for i in ordered]


def test_files_go_longest_first_with_their_tests_in_collected_order() -> None:
    items = [
        Item("tests/a.py", "1"),
        Item("tests/b.py", "1"),
        Item("tests/a.py", "2"),
        Item("tests/c.py", "1"),
        Item("tests/b.py", "2"),
        Item("tests/new.py", "1"),
    ]
    seconds = {"tests/a.py": 1.0, "tests/b.py": 90.0, "tests/c.py": 5.0, "tests/d.py": 3.0}
    # the unlisted file counts as the median, 4.0: after c (5.0), before a (1.0)
    assert _order(items, seconds) == ["b.py:1", "b.py:2", "c.py:1", "new.py:1", "a.py:1", "a.py:2"]


def test_without_a_table_the_order_is_by_path() -> None:
    items = [Item("tests/b.py", "1"), Item("tests/a.py", "1"), Item("tests/b.py", "2")]
    assert _order(items, {}) == ["a.py:1", "b.py:1", "b.py:2"]


def test_the_committed_table_names_existing_test_files_only() -> None:
    seconds = file_seconds()
    assert seconds, "tests/file_seconds.json is missing or empty"
    missing = sorted(name for name in seconds if not (ROOT / name).is_file())
    assert missing == [], f"remeasure with scripts/test_file_seconds.py: {missing}"
