"""`tpumarket job run --replica-deal`: every input runs on two real provider daemons on anvil.

Property: outputs that agree are paid on both deals; where one daemon alters its outputs (its
receipts still verify), the input is vouched on neither deal, both claims are disputed with the
program, and the arbiter's re-execution pays the honest daemon and refunds the lying one's task
with the penalty; the escrow holds exactly what it owes throughout.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from client.jobs import held_back
from contracts.binding import BATCH_PAID, BATCH_REJECTED, TASK_VOUCHED
from contracts.messages import Plan
from tests.arbiter.drill import ArbiterProcess
from tests.client.jobs_support import JobFiles, job, ledger_of, write_files
from tests.e2e.stack import UNIT, Provider, Stack, stack
from tests.polling import wait_until

PLAN = Plan(compile_price=2_000, inference_price=1_000)


def _settlement(arbiter_url: str) -> dict[str, Any]:
    # The config is written `key = value`: a string value carries its own quotes.
    return {"arbiter_url": f'"{arbiter_url}"'}


@pytest.fixture(scope="module")
def world(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[Stack, ArbiterProcess, Provider, Provider]]:
    work = tmp_path_factory.mktemp("replicas")
    with stack(work, lean=True) as st:
        arbiter = ArbiterProcess(
            SimpleNamespace(arbiter=st.arbiter, anvil=st.anvil, escrow=st.escrow),  # type: ignore[arg-type]
            work / "arbiter",
        )
        arbiter.start()
        try:
            honest = st.start_provider(
                "honest", PLAN, slo_ms=5_000, settlement=_settlement(arbiter.url)
            )
            liar = st.start_provider(
                "liar", PLAN, slo_ms=5_000, settlement=_settlement(arbiter.url)
            )
            liar.process.stop()
            liar.process.args = ["-m", "tests.client.lying_provider", *liar.process.args[2:]]
            liar.restart()
            st.escrow.deposit(st.client, 10 * UNIT)
            yield st, arbiter, honest, liar
        finally:
            arbiter.stop()


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> JobFiles:
    return write_files(tmp_path_factory.mktemp("inputs"), {"a": 1_000, "b": 2_000})


def _deal(st: Stack, provider: Provider) -> int:
    # A window long enough for a claim (settleBy minus half of it) to be disputed in it.
    return st.open_deal(st.quote(provider, max_spend=100_000, window=30), provider)


def _args(
    deal: int, provider: Provider, replica: int, other: Provider, files: JobFiles, url: str
) -> list[str]:
    return [
        "run",
        "--deal",
        str(deal),
        "--provider-url",
        provider.url,
        "--replica-deal",
        str(replica),
        "--replica-provider-url",
        other.url,
        "--arbiter-url",
        url,
        "--program",
        str(files.program),
        "--inputs",
        *(str(p) for p in files.inputs.values()),
    ]


def test_replicas_that_agree_are_paid_on_both_deals(
    world: tuple[Stack, ArbiterProcess, Provider, Provider], files: JobFiles, tmp_path: Path
) -> None:
    st, arbiter, honest, _ = world
    second = st.start_provider("honest2", PLAN, slo_ms=5_000, settlement=_settlement(arbiter.url))
    first, other = _deal(st, honest), _deal(st, second)
    out, _ = job(st, tmp_path, *_args(first, honest, other, second, files, arbiter.url))
    summary = out["summary"]
    assert (summary["agree"], summary["disagree"], summary["undecided"]) == (2, 0, 0)
    assert summary["voucher_totals"] == [2 * PLAN.inference_price] * 2

    def vouched() -> bool:
        return all(
            st.escrow.task_status(d, i) == TASK_VOUCHED for d in (first, other) for i in (0, 1)
        )

    wait_until(vouched, 120, "both tasks vouched on both deals")
    assert st.escrow_solvent()


def test_a_lying_replica_is_vouched_on_neither_deal_and_the_arbiter_pays_the_honest_one(
    world: tuple[Stack, ArbiterProcess, Provider, Provider], files: JobFiles, tmp_path: Path
) -> None:
    st, arbiter, honest, liar = world
    first, other = _deal(st, honest), _deal(st, liar)
    args = _args(first, honest, other, liar, files, arbiter.url)
    out, stderr = job(st, tmp_path, *args[:-1], "--wait-rulings")  # one input: "a"
    summary = out["summary"]
    assert (summary["disagree"], summary["undecided"]) == (1, 0), stderr
    assert "replicas disagree on" in stderr and "held back from both vouchers" in stderr
    assert summary["voucher_totals"] == [0, 0]  # neither deal's voucher pays the input
    (row,) = out["inputs"]
    assert row["rulings"] == ["paid by the arbiter's ruling", "refunded by the arbiter's ruling"]
    assert st.escrow.get_batch(first, 0).status == BATCH_PAID  # its claim upheld
    assert st.escrow.get_batch(other, 0).status == BATCH_REJECTED  # refunded with the penalty
    assert st.escrow_solvent()
    # Each ledger records the hold-back: a later run of either deal leaves the task out too.
    assert held_back(ledger_of(st, tmp_path, first)) == held_back(ledger_of(st, tmp_path, other))
    assert held_back(ledger_of(st, tmp_path, first)) == {0}
