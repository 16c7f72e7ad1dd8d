"""One naming of a program's inputs: what ``job export`` prints is what ``job run`` says."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from client.job_files import program_signature
from client.models import export_jax
from client.models.signature import ProgramInputsError


def test_inputs_when_the_program_has_weights_then_export_and_run_name_them_alike() -> None:
    def fn(params: dict[str, Any], x: Any, y: Any) -> Any:
        return x @ params["w"] + params["b"] + y

    weights = {"w": np.ones((4, 3), np.float32), "b": np.zeros(3, np.float32)}
    inputs = [np.ones((2, 4), np.float32), np.ones((2, 3), np.float32)]
    model = export_jax(fn, example_inputs=inputs, weights=weights)
    exported = {s.key: s.describe() for s in model.signature.inputs}  # job export's table
    read = program_signature(model.example_envelope())  # what job run reads from the file

    assert {s.key: s.describe() for s in read.inputs} == exported
    assert list(exported.values()) == ["input0[2,4]:float32", "input1[2,3]:float32"]
    first, second = (s.key for s in read.inputs)
    with pytest.raises(ProgramInputsError) as missing:
        read.check_named({first: inputs[0]})
    assert f"['{second}'] (input1[2,3]:float32)" in str(missing.value)
    with pytest.raises(ProgramInputsError, match=r"input input0\[2,4\]:float32 got dtype"):
        read.check_named({first: inputs[0].astype(np.float64), second: inputs[1]})
