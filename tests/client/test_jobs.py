"""Batches from files: the cap plan, the deal ledger, inputs files, resumed voucher books."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest

from client.cli import main
from client.errors import ClientError
from client.jobs import (
    JobFileError,
    JobTask,
    fit_under_cap,
    inference_tasks,
    read_arrays,
    read_envelope,
)
from client.ledger import DealLedger, LedgerError, PendingAck
from client.session import TaskSpec
from client.vouchers import VoucherBook
from contracts.messages import KIND_INFERENCE, Ack
from contracts.program import (
    ArrayFormat,
    ProducerVersions,
    ProgramEnvelope,
    decode_arrays,
    encode_arrays,
)

ESCROW = "0x" + "ab" * 20


def _envelope() -> ProgramEnvelope:
    return ProgramEnvelope.create(
        program=b"program",
        inputs=b"",
        producer=ProducerVersions("0.10.2", "0.10.2", 9),
        platforms=("cpu",),
        weights=encode_arrays({"0": np.ones(3, np.float32)}),
    )


def _tasks(*prices: int) -> list[JobTask]:
    return [JobTask(str(p), TaskSpec(KIND_INFERENCE, _envelope(), p)) for p in prices]


def test_fit_under_cap_when_the_batch_fits_then_warns_only_near_the_cap() -> None:
    plan = fit_under_cap(_tasks(10, 10), owed=0, cap=100)
    assert (len(plan.run), plan.skipped, plan.projected, plan.warning) == (2, (), 20, None)
    near = fit_under_cap(_tasks(10, 10), owed=65, cap=100)
    assert near.warning == "projected bill 85 is 85% of the cap 100"


def test_fit_under_cap_when_tasks_would_pass_it_then_they_are_not_sent() -> None:
    plan = fit_under_cap(_tasks(30, 30, 5), owed=50, cap=100)
    assert [t.label for t in plan.run] == ["30"]
    assert [t.label for t in plan.skipped] == ["30", "5"]  # order kept: no task jumps the queue
    assert plan.projected == 80 <= plan.cap
    assert (
        plan.warning
        == "the batch could cost 115, past the cap 100 (50 already owed): 2 task(s) not sent"
    )


def test_inference_tasks_keep_the_weights_and_take_inputs_from_npz_or_safetensors(
    tmp_path: Path,
) -> None:
    npz, st = tmp_path / "a.npz", tmp_path / "b.safetensors"
    np.savez(npz, **{"1": np.zeros(2, np.float32)})
    st.write_bytes(encode_arrays({"1": np.ones(2, np.float32)}))
    base = _envelope()
    tasks = inference_tasks(base, [npz, st], 7)
    assert [t.label for t in tasks] == ["inference a.npz", "inference b.safetensors"]
    assert all(t.spec.envelope.weights == base.weights for t in tasks)
    got = decode_arrays(tasks[1].spec.envelope.inputs, ArrayFormat.SAFETENSORS)
    assert list(got) == ["1"] and got["1"].tolist() == [1.0, 1.0]
    assert read_arrays(npz)["1"].tolist() == [0.0, 0.0]


def test_inference_tasks_when_inputs_name_a_weight_or_a_label_then_refuse(tmp_path: Path) -> None:
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(encode_arrays({"0": np.ones(2, np.float32), "audio": np.ones(1, np.float32)}))
    with pytest.raises(JobFileError, match=r"\['0', 'audio'\] are not flat argument indices"):
        inference_tasks(_envelope(), [bad], 7)
    junk = tmp_path / "junk.npz"
    junk.write_bytes(b"PK\x03\x04 not a zip")
    with pytest.raises(JobFileError):
        read_arrays(junk)


def test_ledger_round_trips_and_reserved_indices_are_never_reused(tmp_path: Path) -> None:
    ledger = DealLedger.open(tmp_path, 31337, ESCROW, 4)
    assert ledger.reserve(3) == 0
    ack = Ack(deal_id=4, task_index=2, request_hash=b"\x01" * 32, deadline=99, price=5)
    ledger.pending[2] = PendingAck(ack, b"\x02" * 65, "late")
    ledger.paid, ledger.last_signed, ledger.claimed = {0: 5, 1: 5}, 10, {7}
    ledger.save()
    again = DealLedger.open(tmp_path, 31337, ESCROW.upper().replace("0X", "0x"), 4)
    assert (again.next_index, again.paid, again.last_signed, again.claimed) == (
        3,
        {0: 5, 1: 5},
        10,
        {7},
    )
    assert again.pending[2] == ledger.pending[2]
    assert again.reserve(1) == 3
    ledger.path.rename(tmp_path / "deal-31337-other-5.json")
    with pytest.raises(LedgerError, match="another deal"):
        DealLedger.open(tmp_path, 31337, "other", 5)


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
