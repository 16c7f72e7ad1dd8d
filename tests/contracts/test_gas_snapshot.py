"""The escrow's gas, measured by `scripts/bench-gas`, against the committed snapshot.

A change of the contract that moves a figure fails here until the snapshot is rewritten on
purpose (`scripts/bench-gas --snapshot`) and the change is explained in docs/benchmarks.md.
Signatures vary a little in their zero bytes (calldata costs 4 gas a zero byte, 16 otherwise),
so a figure may move by a few hundred gas between runs; beyond that it is a real change.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SNAPSHOT = ROOT / "contracts" / "gas-snapshot.json"
CALLDATA_NOISE = 0.01  # a 1% move is signature bytes; more is the contract
TARGETS = {"coop_gas_per_task_100": 1_000, "claim_gas_per_task_100": 15_000}


def test_gas_equals_the_committed_snapshot_and_meets_its_targets() -> None:
    run = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "bench_gas.py")],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    measured = json.loads(run.stdout.strip().splitlines()[-1])
    committed = json.loads(SNAPSHOT.read_text())
    assert measured.keys() == committed.keys(), "bench-gas keys changed: rewrite the snapshot"
    moved = {
        key: (committed[key], value)
        for key, value in measured.items()
        if abs(value - committed[key]) > CALLDATA_NOISE * committed[key]
    }
    assert not moved, f"gas moved (committed, measured): {moved}; see scripts/bench-gas --snapshot"
    for key, target in TARGETS.items():
        assert measured[key] <= target, f"{key} = {measured[key]} over its target {target}"
