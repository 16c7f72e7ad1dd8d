"""The shipped build artifacts: equal to a fresh compile, and enough to bind without a compiler."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from contracts import compiler


def test_shipped_artifacts_equal_a_fresh_compile_of_the_sources() -> None:
    shipped = compiler.shipped_artifacts()
    assert shipped is not None, "run `python -m contracts.compiler` to write contracts/artifacts"
    artifacts, built_from = shipped
    assert built_from == compiler.source_hash(), "artifacts are stale: rerun the compiler module"
    fresh = compiler.compile_contracts()
    for name in compiler.CONTRACT_NAMES:
        assert artifacts[name] == fresh[name]


def test_artifacts_load_without_node_or_a_compiler_cache(tmp_path: Path) -> None:
    # A fresh process whose PATH has no node and whose compile cache is empty: loading must not
    # compile (the shipped artifacts match the sources).
    code = (
        "import contracts.compiler as c\n"
        "c._run_solc = None\n"  # any compile attempt would fail
        "a = c.load_contracts()\n"
        "print(sorted(a), len(a['ComputeEscrow'].abi) > 10)\n"
    )
    env = dict(os.environ, PATH=str(Path(sys.executable).parent), TPUMARKET_CACHE=str(tmp_path))
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "['ComputeEscrow', 'SettlementToken'] True"
