"""No module of the packages grows past 500 lines: each file holds one job, named for it."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("contracts", "programs", "services", "market", "provider", "client")
MAX_LINES = 500


def test_no_module_of_the_packages_is_over_500_lines() -> None:
    sizes = {
        str(path.relative_to(ROOT)): len(path.read_text().splitlines())
        for package in PACKAGES
        for path in (ROOT / package).rglob("*.py")
    }
    assert len(sizes) > 100  # the packages were found
    assert {path: n for path, n in sizes.items() if n > MAX_LINES} == {}
