"""Batches from files: the cap plan, the deal ledger (log, crash, migration, lock), inputs files."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from client.cli import main
from client.errors import ClientError, ProgramInputsError
from client.job_cap import fit_under_cap
from client.job_files import JobFileError, JobTask, inference_tasks, read_arrays, read_envelope
from client.ledger import FORMAT, DealLedger, LedgerError, LedgerLocked
from client.ledger_records import TaskRecord, TaskState
from client.tasks import TaskSpec
from client.vouchers import VoucherBook
from contracts.messages import KIND_INFERENCE, Ack, TaskRequest
from programs.envelope import (
    ArrayFormat,
    ProducerVersions,
    ProgramEnvelope,
    decode_arrays,
    encode_arrays,
)
from tests import processes

ESCROW = "0x" + "ab" * 20


def _envelope() -> ProgramEnvelope:
    return ProgramEnvelope.create(
        program=b"program",
        inputs=b"",
        producer=ProducerVersions("0.10.2", "0.10.2", 9),
        platforms=("cpu",),
        weights=encode_arrays({"0": np.ones(3, np.float32)}),
    )


def _program() -> ProgramEnvelope:
    """A real exported program: weights (3,) float32 as argument 0, one input (2,) float32."""
    from client.models import export_jax

    def fn(w: Any, x: Any) -> Any:
        return x * w.sum()

    model = export_jax(fn, weights=np.ones(3, np.float32), example_inputs=[np.zeros(2, np.float32)])
    return model.example_envelope()


def _tasks(*prices: int) -> list[JobTask]:
    return [JobTask(str(p), TaskSpec(KIND_INFERENCE, _envelope(), p)) for p in prices]


def test_fit_under_cap_when_the_batch_fits_then_warns_only_near_the_cap() -> None:
    plan = fit_under_cap(_tasks(10, 10), owed=0, cap=100)
    assert (len(plan.run), plan.skipped, plan.projected, plan.warning) == (2, (), 20, None)
    near = fit_under_cap(_tasks(10, 10), owed=65, cap=100)
    assert near.warning == "projected bill 0.000085 is 85% of the cap 0.000100"


def test_fit_under_cap_when_tasks_would_pass_it_then_they_are_not_sent() -> None:
    plan = fit_under_cap(_tasks(30, 30, 5), owed=50, cap=100)
    assert [t.label for t in plan.run] == ["30"]
    assert [t.label for t in plan.skipped] == ["30", "5"]  # order kept: no task jumps the queue
    assert plan.projected == 80 <= plan.cap
    assert (
        plan.warning
        == "the batch could cost 0.000115, past the cap 0.000100 (0.000050 already owed): "
        "2 task(s) not sent"
    )


def test_inference_tasks_keep_the_weights_and_take_inputs_from_npz_or_safetensors(
    tmp_path: Path,
) -> None:
    npz, st = tmp_path / "a.npz", tmp_path / "b.safetensors"
    np.savez(npz, **{"1": np.zeros(2, np.float32)})
    st.write_bytes(encode_arrays({"1": np.ones(2, np.float32)}))
    base = _program()
    tasks = inference_tasks(base, [npz, st], 7)
    assert [t.label for t in tasks] == ["inference a.npz", "inference b.safetensors"]
    assert all(t.spec.envelope.weights == base.weights for t in tasks)
    got = decode_arrays(tasks[1].spec.envelope.inputs, ArrayFormat.SAFETENSORS)
    assert list(got) == ["1"] and got["1"].tolist() == [1.0, 1.0]
    assert read_arrays(npz)["1"].tolist() == [0.0, 0.0]


def test_inference_tasks_when_inputs_name_a_weight_or_a_label_then_refuse(tmp_path: Path) -> None:
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(encode_arrays({"0": np.ones(2, np.float32), "audio": np.ones(1, np.float32)}))
    with pytest.raises(ProgramInputsError, match=r"missing inputs \['1'\]"):
        inference_tasks(_program(), [bad], 7)
    bad.write_bytes(encode_arrays({"1": np.ones(2, np.float32), "audio": np.ones(1, np.float32)}))
    with pytest.raises(ProgramInputsError, match=r"\['audio'\] are not inputs of the program"):
        inference_tasks(_program(), [bad], 7)
    for wrong, why in (
        (np.ones(3, np.float32), "axis 0 must be 2"),
        (np.ones(2, np.float64), "got dtype float64, expected float32"),
        (np.ones((2, 1), np.float32), "got rank 2"),
    ):
        bad.write_bytes(encode_arrays({"1": wrong}))
        with pytest.raises(ProgramInputsError, match=why):
            inference_tasks(_program(), [bad], 7)
    junk = tmp_path / "junk.npz"
    junk.write_bytes(b"PK\x03\x04 not a zip")
    with pytest.raises(JobFileError):
        read_arrays(junk)


def _record(index: int, state: TaskState = TaskState.ACKED, run: int = 1) -> TaskRecord:
    request = TaskRequest(4, index, KIND_INFERENCE, b"\x01" * 32, b"\x02" * 32, 5, 1_000 + index)
    ack = Ack(deal_id=4, task_index=index, request_hash=request.struct_hash(), price=5)
    return TaskRecord(
        index=index,
        run=run,
        label=f"task {index}",
        request=request,
        request_signature=b"\x03" * 65,
        state=state,
        ack=ack,
        ack_signature=b"\x04" * 65,
    )


def test_ledger_round_trips_tasks_through_its_log_and_never_reuses_an_index(
    tmp_path: Path,
) -> None:
    ledger = DealLedger.open(tmp_path, 31337, ESCROW, 4)
    assert ledger.start_run() == 1
    assert ledger.reserve(3) == 0
    ledger.put(_record(2))
    ledger.put(_record(0, TaskState.VERIFIED))  # logged, not yet in the snapshot
    ledger.close()
    assert ledger.path.with_suffix(".log").read_text().count("\n") == 2
    again = DealLedger.open(tmp_path, 31337, ESCROW.upper().replace("0X", "0x"), 4)
    assert again.tasks[2] == _record(2) and again.tasks[0].state == TaskState.VERIFIED
    assert set(again.pending) == {2}  # acked, not verified: refundable in time
    assert again.unfinished_runs() == [1]
    assert again.reserve(1) == 3
    again.close()
    again.path.rename(tmp_path / "deal-31337-other-5.json")
    with pytest.raises(LedgerError, match="another deal"):
        DealLedger.open(tmp_path, 31337, "other", 5)


def test_ledger_after_a_crash_mid_append_ignores_the_torn_line_and_keeps_the_rest(
    tmp_path: Path,
) -> None:
    ledger = DealLedger.open(tmp_path, 31337, ESCROW, 4)
    ledger.reserve(2)
    ledger.put(_record(0))
    ledger.close()
    log = ledger.path.with_suffix(".log")
    whole = json.dumps({"seq": 99, "task": _record(1).to_json()})
    log.write_text(log.read_text() + whole[: len(whole) // 2])  # killed while writing
    again = DealLedger.open(tmp_path, 31337, ESCROW, 4)
    assert set(again.tasks) == {0}
    again.put(_record(1))  # the torn tail was folded away: this line stands alone
    again.close()
    assert set(DealLedger.open(tmp_path, 31337, ESCROW, 4, lock=False).tasks) == {0, 1}


def test_ledger_of_format_1_migrates_on_open_and_keeps_the_old_file(tmp_path: Path) -> None:
    path = DealLedger.file_for(tmp_path, 31337, ESCROW, 4)
    v1_ack = {"dealId": 4, "taskIndex": 2, "requestHash": "0x" + "01" * 32}
    old = {
        "format": 1,
        "chain_id": 31337,
        "escrow": ESCROW,
        "deal_id": 4,
        "next_index": 5,
        "paid": {"0": 5, "1": 5},
        "claimed": [3],
        "last_signed": 10,
        "pending": {"2": {"ack": v1_ack, "signature": "0x" + "02" * 65, "reason": "late"}},
        "refunded": {"4": [5, 50]},
    }
    path.write_text(json.dumps(old))
    ledger = DealLedger.open(tmp_path, 31337, ESCROW, 4)
    assert (ledger.next_index, ledger.paid, ledger.last_signed) == (5, {0: 5, 1: 5}, 10)
    assert ledger.settled_elsewhere == {3, 4} and ledger.last_tasks == {0, 1}
    ledger.close()
    assert json.loads(path.read_text())["format"] == FORMAT == 2
    assert json.loads(path.with_suffix(".format1.bak").read_text()) == old
    book = VoucherBook(deal_id=4, cap=100)
    book.restore(ledger.paid, ledger.settled_elsewhere, ledger.last_signed, ledger.last_tasks)
    assert not book.has_news()


def test_second_run_on_same_deal_refused_by_lock(tmp_path: Path) -> None:
    first = DealLedger.open(tmp_path, 31337, ESCROW, 4)
    with pytest.raises(LedgerLocked, match=rf"deal 4 is in use by process {os.getpid()}"):
        DealLedger.open(tmp_path, 31337, ESCROW, 4)
    reader = DealLedger.open(tmp_path, 31337, ESCROW, 4, lock=False)
    with pytest.raises(LedgerError, match="read-only"):
        reader.reserve(1)
    first.close()
    DealLedger.open(tmp_path, 31337, ESCROW, 4).close()  # released: the next run may start


def test_lock_of_a_run_killed_with_sigkill_is_released_by_the_kernel(tmp_path: Path) -> None:
    holder = processes.spawn(
        [
            sys.executable,
            "-c",
            "import sys, pathlib; from client.ledger import DealLedger; "
            f"held = DealLedger.open(pathlib.Path({str(tmp_path)!r}), 31337, {ESCROW!r}, 4); "
            "print('held', flush=True); sys.stdin.read()",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        with pytest.raises(LedgerLocked, match=f"process {holder.pid}"):
            DealLedger.open(tmp_path, 31337, ESCROW, 4)
        holder.kill()
        holder.wait()
        DealLedger.open(tmp_path, 31337, ESCROW, 4).close()
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait()


def test_voucher_book_restored_from_a_ledger_stays_cumulative_and_under_the_cap() -> None:
    book = VoucherBook(deal_id=1, cap=20)
    book.restore({0: 5, 1: 5}, {3}, 10)
    assert (book.total, book.last_signed, book.paid, book.claimed) == (10, 10, {0: 5, 1: 5}, {3})
    with pytest.raises(ClientError, match="nothing new"):
        book.next_voucher()
    with pytest.raises(ClientError, match="not empty"):
        book.restore({}, set(), 0)
    with pytest.raises(ClientError, match="exceed its cap"):
        VoucherBook(deal_id=1, cap=9).restore({0: 10}, set(), 10)
    with pytest.raises(ClientError, match="both paid and claimed"):
        VoucherBook(deal_id=1, cap=99).restore({0: 10}, {0}, 10)


@pytest.mark.skipif(
    importlib.util.find_spec("silero_vad") is None or importlib.util.find_spec("onnx") is None,
    reason="the zoo's model needs silero-vad and onnx (make setup installs them)",
)
def test_job_export_writes_a_program_whose_example_inputs_file_runs_as_a_task(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "vad.tpmp"
    args = ["job", "export", "silero-vad", "--out", str(out), "--batch", "2", "--chunks", "2"]
    assert main([*args, "--json"]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["inputs_names"] == {
        "15": "audio[batch,1024]:float32",
        "16": "state[2,batch,128]:float32",
        "17": "context[batch,64]:float32",
    }
    program = read_envelope(out)
    [task] = inference_tasks(program, [Path(summary["inputs"])], 4_000)
    assert task.spec.envelope.inputs_sha256 == program.inputs_sha256  # the same example inputs
    assert task.spec.envelope.program_sha256 == program.program_sha256
