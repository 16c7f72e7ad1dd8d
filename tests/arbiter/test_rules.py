"""The arbiter's rules, pure: who wins a task from the evidence and the re-execution."""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from programs.envelope import encode_arrays
from provider.arbiter.rules import (
    Rerun,
    TaskFacts,
    Tolerance,
    Verdict,
    judge_rerun,
    judge_without_rerun,
    provider_wins,
)

OUT = encode_arrays({"0": np.arange(6, dtype=np.float32).reshape(2, 3)})


def facts(
    outputs: bytes | None = OUT, *, program_ok: bool | None = True, status: int = 0
) -> TaskFacts:
    return TaskFacts(
        task_index=3,
        status=status,
        output_hash=hashlib.sha256(OUT).digest(),
        outputs=outputs,
        outputs_sha256=None if outputs is None else hashlib.sha256(outputs).digest(),
        program_ok=program_ok,
    )


def test_missing_or_unreceipted_outputs_lose_before_anything_runs() -> None:
    missing = judge_without_rerun(facts(None))
    assert missing is not None and missing.verdict is Verdict.OUTPUTS_MISSING
    other = judge_without_rerun(facts(OUT + b"x"))
    assert other is not None and other.verdict is Verdict.OUTPUTS_NOT_RECEIPTED
    assert not missing.verdict.provider_wins and not other.verdict.provider_wins


def test_a_client_without_its_program_loses_when_the_outputs_are_receipted() -> None:
    ruling = judge_without_rerun(facts(program_ok=None))
    assert ruling is not None and ruling.verdict is Verdict.PROGRAM_MISSING
    assert ruling.verdict.provider_wins
    assert judge_without_rerun(facts()) is None  # complete evidence: only a re-run decides


def test_re_execution_inside_the_tolerance_upholds_and_outside_it_rejects() -> None:
    near = encode_arrays({"0": np.arange(6, dtype=np.float32).reshape(2, 3) + 1e-5})
    far = encode_arrays({"0": np.arange(6, dtype=np.float32).reshape(2, 3) + 0.5})
    tol = Tolerance()
    up = judge_rerun(facts(), Rerun(0, near, 1), tol, compile_task=False)
    down = judge_rerun(facts(), Rerun(0, far, 1), tol, compile_task=False)
    assert up.verdict is Verdict.UPHELD
    assert down.verdict is Verdict.OUTPUTS_DIFFER and "differs by up to 0.5" in down.detail


def test_a_failure_is_upheld_only_when_the_re_execution_fails_the_same_way() -> None:
    failed = facts(status=7)
    assert judge_rerun(failed, Rerun(7, b"{}", 1), Tolerance(), compile_task=False).verdict is (
        Verdict.UPHELD
    )
    differs = judge_rerun(failed, Rerun(0, OUT, 1), Tolerance(), compile_task=False)
    assert differs.verdict is Verdict.VERDICT_DIFFERS


def test_compile_reports_compare_target_and_memory_within_one_percent() -> None:
    report = {
        "target": "v5e:1x1",
        "platform": "tpu",
        "device_kind": "TPU v5 lite",
        "memory_total_bytes": 1_000_000,
    }
    delivered = json.dumps(report).encode()
    task = TaskFacts(
        3,
        0,
        hashlib.sha256(delivered).digest(),
        delivered,
        hashlib.sha256(delivered).digest(),
        True,
    )
    same = json.dumps({**report, "memory_total_bytes": 1_005_000}).encode()
    other = json.dumps({**report, "memory_total_bytes": 2_000_000}).encode()
    assert judge_rerun(task, Rerun(0, same, 0), Tolerance(), compile_task=True).verdict is (
        Verdict.UPHELD
    )
    assert judge_rerun(task, Rerun(0, other, 0), Tolerance(), compile_task=True).verdict is (
        Verdict.OUTPUTS_DIFFER
    )


def test_integers_compare_exactly_and_shapes_and_names_must_match() -> None:
    tol = Tolerance()
    a = {"0": np.array([1, 2, 3], np.int32)}
    assert tol.compare(a, a) is None
    assert tol.compare({"0": np.array([1, 2, 4], np.int32)}, a) is not None
    assert tol.compare({"0": np.array([1, 2], np.int32)}, a) is not None
    assert tol.compare({"1": np.array([1, 2, 3], np.int32)}, a) is not None


@given(st.lists(st.sampled_from(list(Verdict)), min_size=0, max_size=8))
def test_the_provider_wins_a_batch_only_by_winning_every_task(verdicts: list[Verdict]) -> None:
    from provider.arbiter.rules import TaskRuling

    rulings = [TaskRuling(i, v, "") for i, v in enumerate(verdicts)]
    assert provider_wins(rulings) == (bool(verdicts) and all(v.provider_wins for v in verdicts))


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
def test_nan_in_the_same_place_is_equal(dtype: str) -> None:
    a = {"0": np.array([np.nan, 1.0], dtype)}
    assert Tolerance().compare(a, a) is None
