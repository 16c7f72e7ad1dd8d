"""The settlement soak, short: `scripts/soak` with every fault once, audited from the chain.

The script starts anvil, the market and two provider daemons, opens a deal with each through
the market and runs 30 tasks with `tpumarket job run` subprocesses while it kills a daemon
(-9) and restarts it, stops anvil (SIGSTOP) for 3 s, kills a client run (-9) and runs it
again once the daemon has claimed what that run had not paid, and interrupts a client run
twice (SIGINT); one of p2's tasks runs past its deadline.
Then it settles everything and reads every figure back from the chain and the daemons'
journals. The full run (200 tasks, 10 s freezes, each fault twice) is `scripts/soak`; its
figures are in docs/benchmarks.md.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
KEYS = {
    "tasks_acked",
    "tasks_paid",
    "tasks_refunded",
    "tasks_lost",
    "tasks_paid_twice",
    "honest_provider_losses",
    "honest_client_losses",
    "invariant_ok",
}


@pytest.fixture(scope="module")
def soak(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    work = tmp_path_factory.mktemp("soak")
    args = ["--tasks", "30", "--batch", "6", "--rounds", "1", "--freeze-s", "3"]
    args += ["--window", "40", "--late-fraction", "0.1", "--work-dir", str(work)]
    done = subprocess.run(
        [str(ROOT / "scripts" / "soak"), *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]
    print(done.stderr[-6000:], done.stdout.strip().splitlines()[-1], sep="\n")  # on failures
    figures: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return figures


def test_soak_ends_with_one_json_line_of_the_eight_figures(soak: dict[str, Any]) -> None:
    assert set(soak) >= KEYS
    assert isinstance(soak["invariant_ok"], bool)


def test_soak_injects_every_fault_mid_run(soak: dict[str, Any]) -> None:
    assert (soak["provider_kills"], soak["chain_freezes"]) == (1, 1)
    assert (soak["client_kills"], soak["double_sigints"]) == (1, 1)
    assert soak["client_reruns"] >= 1  # the killed run, run again (it resumes)


def test_soak_settles_every_acked_task_once_and_loses_no_money(soak: dict[str, Any]) -> None:
    # Every input acked; a rerun resumes the tasks in flight (a late one that was refunded may
    # run again under a new index, and be paid once).
    assert soak["inputs_acked"] == soak["tasks_requested"] == 30
    assert soak["tasks_acked"] >= 30
    assert soak["tasks_paid"] + soak["tasks_refunded"] == soak["tasks_acked"]
    assert soak["tasks_paid"] > 0
    assert soak["tasks_claimed"] >= 1  # what the killed client had not vouched for
    assert soak["tasks_refunded"] >= 1  # p2's task made late, and any queued behind it
    assert soak["penalties_to_clients"] == 1_000 * soak["tasks_refunded"]  # the deals' penalty
    assert soak["tasks_lost"] == 0
    assert soak["tasks_paid_twice"] == 0
    assert soak["honest_provider_losses"] == 0
    assert soak["honest_client_losses"] == 0
    assert soak["invariant_ok"] is True


def test_soak_closes_every_deal_after_the_chain_clock_passes_every_settlement_instant(
    soak: dict[str, Any],
) -> None:
    assert soak["deals"] == 2
    assert soak["on_time_unsettled_before_jump"] == 0
    assert soak["claims_finalized"] is True
    assert soak["deals_closed"] is True
