"""Assertions shared by the sandbox tests."""

from __future__ import annotations

from typing import Any

import numpy as np

from programs.envelope import ArrayFormat, decode_arrays
from provider.diagnosis import Category
from provider.sandbox import CompileResult, InferenceResult, TaskFailure


def ran(result: InferenceResult | TaskFailure) -> InferenceResult:
    """Return the result, failing the test with its diagnosis if the task failed."""
    assert isinstance(result, InferenceResult), result
    return result


def compiled(result: CompileResult | TaskFailure) -> CompileResult:
    """Return the compile result, failing the test with its diagnosis if it failed."""
    assert isinstance(result, CompileResult), result
    return result


def failed(result: object, category: Category) -> TaskFailure:
    """Assert the task failed with ``category`` and return the failure."""
    assert isinstance(result, TaskFailure), result
    assert result.diagnosis.category is category, result.diagnosis
    assert result.diagnosis.hints
    return result


def outputs(result: InferenceResult) -> list[np.ndarray[Any, Any]]:
    """Decode a result's outputs in flat order."""
    arrays = decode_arrays(result.outputs, ArrayFormat.SAFETENSORS)
    return [arrays[str(i)] for i in range(len(arrays))]
