"""The compiled engine: built by the setup step, loaded, equal to its source, never stale."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

import market.engine.book
import market.engine.engine
from market.native import (
    COMPILED_MODULES,
    StaleExtensionError,
    built_extensions,
    check_extensions,
)

ROOT = Path(__file__).resolve().parents[2]

# Replays a benchmark trace and prints a digest of every fill and the final snapshot, plus the
# file the engine was loaded from; run once on the built tree and once on a copy of the sources.
DIGEST = """
import hashlib, json, sys
sys.path.insert(0, sys.argv[1])
import bench_market_engine as bench
import market.engine.book as book
from market.engine import MatchingEngine
engine = MatchingEngine()
digest = hashlib.sha256()
for kind, order, order_id, now in bench.generate_replay(20_000, seed=5):
    if kind == 0:
        result = engine.place(order, now=now)
    elif kind == 1:
        result = [engine.cancel(order_id)]
    else:
        result = engine.expire(now)
    digest.update(repr(result).encode())
digest.update(json.dumps(engine.snapshot(), sort_keys=True).encode())
print(json.dumps({"digest": digest.hexdigest(), "file": book.__file__}))
"""


def run_digest(tree: Path) -> dict[str, str]:
    """Run the replay with `tree` first on the import path; return its digest and engine file."""
    result = subprocess.run(
        [sys.executable, "-c", DIGEST, str(ROOT / "scripts")],
        capture_output=True,
        text=True,
        check=True,
        cwd=tree,
        env={**os.environ, "PYTHONPATH": str(tree)},
    )
    answer: dict[str, str] = json.loads(result.stdout.strip().splitlines()[-1])
    return answer


def test_setup_built_every_compiled_module_and_they_are_the_ones_loaded() -> None:
    # `make test` runs the setup step first: the suite exercises the engine the market runs.
    found = built_extensions()
    assert set(found) == set(COMPILED_MODULES)
    assert Path(market.engine.book.__file__) == found["market.engine.book"]
    assert Path(market.engine.engine.__file__) == found["market.engine.engine"]


def test_compiled_engine_yields_exactly_what_its_source_does(tmp_path: Path) -> None:
    source_tree = tmp_path / "source"
    shutil.copytree(
        ROOT / "market",
        source_tree / "market",
        ignore=shutil.ignore_patterns("*.so", "__pycache__", "web"),
    )
    compiled = run_digest(ROOT)
    plain = run_digest(source_tree)
    assert compiled["file"].endswith(".so")
    assert plain["file"].endswith("book.py")
    assert compiled["digest"] == plain["digest"]


def fake_tree(root: Path) -> tuple[Path, Path]:
    """Write a source and an extension for `market.engine.book` under `root`; return both."""
    package = root / "market" / "engine"
    package.mkdir(parents=True)
    source = package / "book.py"
    source.write_text("x = 1\n")
    extension = package / ("book" + market_suffix())
    extension.write_bytes(b"\x7fELF")
    return source, extension


def market_suffix() -> str:
    """Return the extension suffix this interpreter imports first."""
    from importlib.machinery import EXTENSION_SUFFIXES

    return EXTENSION_SUFFIXES[0]


def test_extension_older_than_its_source_is_refused_with_the_fix(tmp_path: Path) -> None:
    _, extension = fake_tree(tmp_path)
    past = time.time() - 60
    os.utime(extension, (past, past))
    with pytest.raises(StaleExtensionError, match=r"market/engine/book\.py.*make setup"):
        check_extensions(tmp_path)


def test_extension_newer_than_its_source_or_no_extension_is_accepted(tmp_path: Path) -> None:
    source, extension = fake_tree(tmp_path)
    past = time.time() - 60
    os.utime(source, (past, past))
    check_extensions(tmp_path)
    extension.unlink()
    check_extensions(tmp_path)
    assert built_extensions(tmp_path) == {}


def test_stale_extension_stops_the_market_import_in_a_new_process(tmp_path: Path) -> None:
    tree = tmp_path / "tree"
    shutil.copytree(ROOT / "market", tree / "market", ignore=shutil.ignore_patterns("web"))
    source = tree / "market" / "engine" / "book.py"
    future = time.time() + 60
    os.utime(source, (future, future))
    result = subprocess.run(
        [sys.executable, "-c", "import market.engine"],
        capture_output=True,
        text=True,
        cwd=tree,
        env={**os.environ, "PYTHONPATH": str(tree)},
    )
    assert result.returncode == 1
    assert "StaleExtensionError" in result.stderr
