"""Export diagnosis hints that work when followed, on small real PyTorch modules (torchax route).

A Python `if` on a tensor's value and `torch.cond` are both control flow, and the hint they get
(torch.where) exports and runs equal to eager, where torch.cond fails; `torch.unique` is a
dynamic shape; a generic failure of a model that runs in eager offers the other route.
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

from client.models import export_torch, run_local
from client.models.export_diagnosis import ExportCategory, ExportFailed, diagnose_export

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning")
X = np.random.default_rng(0).standard_normal((4, 4)).astype(np.float32)


class _Fn(nn.Module):
    def __init__(self, fn: Any) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, x: Any) -> Any:
        return self.fn(x)


def _branch(x: Any) -> Any:
    if x.sum() > 0:  # Python control flow on a value
        return x * 2
    return x - 1


def _cond(x: Any) -> Any:
    return torch.cond(x.sum() > 0, lambda t: t * 2, lambda t: t - 1, (x,))


def _failure(fn: Any) -> ExportFailed:
    with warnings.catch_warnings(), pytest.raises(ExportFailed) as raised:
        warnings.simplefilter("ignore")
        export_torch(_Fn(fn), [X])
    return raised.value


def _equals_eager(fn: Any) -> None:
    """Export `fn` by torchax, run the program here; it equals torch eager."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = export_torch(_Fn(fn), [X])
    out = run_local(model.example_envelope())
    got = np.asarray(out[0] if isinstance(out, tuple | list) else out)
    np.testing.assert_allclose(got, fn(torch.as_tensor(X)).numpy(), atol=1e-6)


@pytest.mark.parametrize("fn", [_branch, _cond], ids=["python_if", "torch_cond"])
def test_control_flow_hint_names_torch_where_which_exports_and_equals_eager(fn: Any) -> None:
    diagnosis = _failure(fn).diagnosis
    assert diagnosis.category is ExportCategory.DATA_DEPENDENT_CONTROL_FLOW, diagnosis
    assert "torch.where(condition, a, b)" in diagnosis.hints[0]
    assert not any("or torch.cond" in h for h in diagnosis.hints)  # it fails on both routes
    assert any("torch.cond and torch.while_loop do not export" in h for h in diagnosis.hints)
    if fn is _cond:
        assert diagnosis.op == "torch.cond", diagnosis

    # The hint, followed: both branches computed, one picked by torch.where.
    _equals_eager(lambda x: torch.where(x.sum() > 0, x * 2, x - 1))


def test_unique_on_torchax_is_a_dynamic_shape_and_the_masked_form_exports() -> None:
    diagnosis = _failure(torch.unique).diagnosis
    assert diagnosis.category is ExportCategory.DYNAMIC_SHAPE, diagnosis
    assert diagnosis.op is not None and "unique" in diagnosis.op
    masked = _failure(lambda x: x[x > 0]).diagnosis
    assert masked.category is ExportCategory.DYNAMIC_SHAPE
    assert "torch.where over the full tensor and a mask" in masked.hints[0]
    _equals_eager(lambda x: torch.where(x > 0, x, torch.zeros_like(x)))  # the hint, followed


def test_a_generic_failure_of_a_model_that_runs_in_eager_offers_the_other_route() -> None:
    inverse = _failure(torch.linalg.inv)  # torchax cannot lower it; eager runs it
    assert inverse.diagnosis.category is ExportCategory.OTHER, inverse.diagnosis
    assert "--from torch-xla" in inverse.diagnosis.hints[0]
    assert "runs in eager PyTorch" in str(inverse)

    def broken(x: Any) -> Any:
        return x @ torch.ones(3, 3)  # (4, 4) @ (3, 3): fails in eager too

    failed = _failure(broken)
    assert not any("--from torch-xla ..." in h for h in failed.diagnosis.hints)


@pytest.mark.parametrize(
    "text",
    [
        "NotImplementedError: op not capturable by Pytorch/XLA: higher_order::cond",
        "RuntimeError: While executing %cond : call_function[target=torch.ops.higher_order.cond]",
    ],
)
def test_higher_order_ops_are_control_flow_not_custom_ops(text: str) -> None:
    diagnosis = diagnose_export(text, route="torch_xla")
    assert diagnosis.category is ExportCategory.DATA_DEPENDENT_CONTROL_FLOW, diagnosis
    assert diagnosis.op is not None and diagnosis.op.startswith("higher_order")
    custom = diagnose_export(
        "RuntimeError: target=torch.ops.mylib.fused.default has no lowering", route="torch_xla"
    )
    assert custom.category is ExportCategory.CUSTOM_OP
