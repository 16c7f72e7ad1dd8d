#!/usr/bin/env python3
"""Write `tests/file_seconds.json`, the seconds each test file took, from JUnit reports.

Usage: `make unit ARGS=--junitxml=/tmp/run.xml`, then
`.venv/bin/python scripts/test_file_seconds.py /tmp/run.xml [more.xml ...]` (several reports:
each file's mean). A test's time is its set-up, call and tear-down; a file's, its tests' sum.
The suite hands files out costliest first by this table (`tests/file_order.py`).
"""

from __future__ import annotations

import argparse
import json
import xml.etree.ElementTree as ElementTree
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TABLE = ROOT / "tests" / "file_seconds.json"


def test_file(classname: str) -> str | None:
    """Return the test file (from the repository root) a JUnit `classname` names."""
    parts = classname.split(".")
    while parts:
        candidate = ROOT.joinpath(*parts).with_suffix(".py")
        if candidate.is_file():
            return candidate.relative_to(ROOT).as_posix()
        parts.pop()
    return None


def seconds_per_file(report: Path) -> dict[str, float]:
    """Return each test file's seconds in one JUnit report."""
    totals: dict[str, float] = defaultdict(float)
    for case in ElementTree.parse(report).getroot().iter("testcase"):
        name = test_file(case.get("classname", ""))
        if name is not None:
            totals[name] += float(case.get("time", 0))
    return dict(totals)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("reports", nargs="+", type=Path)
    parser.add_argument("--output", type=Path, default=TABLE)
    args = parser.parse_args(argv)
    runs = [seconds_per_file(report) for report in args.reports]
    names = sorted({name for run in runs for name in run})
    files = {name: round(sum(run.get(name, 0.0) for run in runs) / len(runs), 1) for name in names}
    ordered = dict(sorted(files.items(), key=lambda pair: (-pair[1], pair[0])))
    table = {"total_s": round(sum(files.values()), 1), "files": ordered}
    args.output.write_text(json.dumps(table, indent=1) + "\n")
    print(f"{len(files)} files, {table['total_s']} s of tests, written to {args.output}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
