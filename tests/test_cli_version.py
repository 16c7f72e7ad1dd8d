"""`tpumarket --version` answers before any subcommand, and so before web3, is imported."""

from __future__ import annotations

import subprocess
import sys

PROBE = """
import sys
import contracts.cli
code = contracts.cli.main(["--version"])
heavy = sorted(m for m in ("web3", "eth_account", "jax", "fastapi", "market", "provider", "client")
               if m in sys.modules)
print("HEAVY", heavy, code)
"""


def test_version_imports_no_subcommand_nor_web3() -> None:
    done = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, check=True, timeout=120
    )
    lines = done.stdout.splitlines()
    assert lines[0].startswith("tpumarket ")
    assert lines[1] == "HEAVY [] 0"


GROUP_PROBE = """
import contextlib, io, sys
import contracts.cli
with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):
    contracts.cli.main(["provider", "--help"])
print("OTHERS", sorted(m for m in ("market.cli", "client.cli", "client.demo") if m in sys.modules))
"""


def test_a_command_naming_its_group_loads_that_group_alone() -> None:
    """`tpumarket provider run` starts the daemon without importing the market's or the
    client's command modules (seconds of a start on a loaded host)."""
    done = subprocess.run(
        [sys.executable, "-c", GROUP_PROBE], capture_output=True, text=True, check=True, timeout=120
    )
    assert done.stdout.splitlines()[-1] == "OTHERS []"
