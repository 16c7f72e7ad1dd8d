"""Export diagnosis hints that work when followed, on small real PyTorch modules (torchax route).

A Python `if` on a tensor's value and `torch.cond` are both control flow, and the hint they get
(torch.where) exports and runs equal to eager, where torch.cond fails; `torch.unique` is a
dynamic shape; a generic failure of a model that runs in eager offers the other route.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from client.cli import build_parser
from client.models import export_torch, run_local
from client.models.export_diagnosis import ExportCategory, ExportFailed, diagnose_export

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning")
X = np.random.default_rng(0).standard_normal((4, 4)).astype(np.float32)


def _module(fn: Any) -> Any:
    """Return a torch module whose forward is `fn` (torch imported here: the module imports it
    lazily, so the fast set, whose tests here need no torch, never pays for it)."""
    import torch

    class _Fn(torch.nn.Module):
        def forward(self, x: Any) -> Any:
            return fn(x)

    return _Fn()


def _branch(x: Any) -> Any:
    if x.sum() > 0:  # Python control flow on a value
        return x * 2
    return x - 1


def _cond(x: Any) -> Any:
    import torch

    return torch.cond(x.sum() > 0, lambda t: t * 2, lambda t: t - 1, (x,))


def _failure(fn: Any) -> ExportFailed:
    with warnings.catch_warnings(), pytest.raises(ExportFailed) as raised:
        warnings.simplefilter("ignore")
        export_torch(_module(fn), [X])
    return raised.value


def _equals_eager(fn: Any) -> None:
    """Export `fn` by torchax, run the program here; it equals torch eager."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = export_torch(_module(fn), [X])
    out = run_local(model.example_envelope())
    got = np.asarray(out[0] if isinstance(out, tuple | list) else out)
    import torch

    np.testing.assert_allclose(got, fn(torch.as_tensor(X)).numpy(), atol=1e-6)


@pytest.mark.parametrize("fn", [_branch, _cond], ids=["python_if", "torch_cond"])
def test_control_flow_hint_names_torch_where_which_exports_and_equals_eager(fn: Any) -> None:
    import torch

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
    import torch

    diagnosis = _failure(torch.unique).diagnosis
    assert diagnosis.category is ExportCategory.DYNAMIC_SHAPE, diagnosis
    assert diagnosis.op is not None and "unique" in diagnosis.op
    masked = _failure(lambda x: x[x > 0]).diagnosis
    assert masked.category is ExportCategory.DYNAMIC_SHAPE
    assert "torch.where over the full tensor and a mask" in masked.hints[0]
    _equals_eager(lambda x: torch.where(x > 0, x, torch.zeros_like(x)))  # the hint, followed


def test_a_generic_failure_of_a_model_that_runs_in_eager_offers_the_other_route() -> None:
    import torch

    inverse = _failure(torch.linalg.inv)  # torchax cannot lower it; eager runs it
    assert inverse.diagnosis.category is ExportCategory.OTHER, inverse.diagnosis
    assert "--from torch-xla" in inverse.diagnosis.hints[0]
    assert "runs in eager PyTorch" in str(inverse)

    def broken(x: Any) -> Any:
        return x @ torch.ones(3, 3)  # (4, 4) @ (3, 3): fails in eager too

    failed = _failure(broken)
    assert not any("--from torch-xla ..." in h for h in failed.diagnosis.hints)
    # torch.export, the step both routes take, fails on it: no route is offered.
    shared = _failure(lambda x: x * torch.from_numpy(x.detach().numpy()))
    assert shared.diagnosis.stage == "export"
    assert not any("--from torch-xla ..." in h for h in shared.diagnosis.hints)


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


TORCH_XLA_MODELS = """
import torch


class Spectrum(torch.nn.Module):
    def forward(self, x):
        return torch.fft.rfft(x).abs()  # torch_xla cannot lower it; torchax can


class Cond(torch.nn.Module):
    def forward(self, x):
        return torch.cond(x.sum() > 0, lambda t: t * 2, lambda t: t - 1, (x,))


class ToNumpy(torch.nn.Module):
    def forward(self, x):
        return x * torch.from_numpy(x.detach().numpy())  # runs in eager; exports by neither


def make_spectrum():
    return Spectrum()


def make_cond():
    return Cond()


def make_to_numpy():
    return ToNumpy()
"""


@pytest.mark.parametrize(
    ("factory", "offered"), [("make_spectrum", True), ("make_to_numpy", False)]
)
def test_a_torch_xla_failure_offers_torchax_only_when_torchax_exports_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], factory: str, offered: bool
) -> None:
    source = tmp_path / "models.py"
    source.write_text(TORCH_XLA_MODELS)
    argv = ["job", "export", "--from", "torch-xla", f"{source}:{factory}"]
    argv += ["--example-inputs", "float32[4,4]", "--out", str(tmp_path / "m.tpmp"), "--json"]
    args = build_parser().parse_args(argv)

    assert args.handler(args) == 1
    failed = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    lead = "The model exports by torchax: export it by the other route, `tpumarket job export "
    assert failed["hints"][0].startswith(lead) is offered, failed
    assert not (tmp_path / "m.tpmp").exists()


def test_torch_cond_on_torch_xla_is_control_flow_not_a_custom_op(tmp_path: Path) -> None:
    from client.models.from_torch_xla import export_torch_xla

    source = tmp_path / "models.py"
    source.write_text(TORCH_XLA_MODELS)
    with pytest.raises(ExportFailed) as raised:
        export_torch_xla(f"{source}:make_cond", [X])
    diagnosis = raised.value.diagnosis
    assert diagnosis.category is ExportCategory.DATA_DEPENDENT_CONTROL_FLOW, diagnosis
    assert diagnosis.op == "higher_order.cond"
    assert "torch.where(condition, a, b)" in diagnosis.hints[0]
