"""PyTorch modules converted through torch.export + torchax, run in the provider's sandbox."""

from __future__ import annotations

import importlib.util
import warnings
from typing import Any

import numpy as np
import pytest

from client.errors import ModelConversionError
from client.models import ExportedModel, export_torch
from provider.sandbox import Sandbox
from tests.client.models.helpers import run_in_sandbox

pytestmark = [
    pytest.mark.skipif(
        importlib.util.find_spec("torch") is None or importlib.util.find_spec("torchax") is None,
        reason="torch==2.13.0 and torchax==0.0.13 are not installed",
    ),
    pytest.mark.filterwarnings("ignore::FutureWarning"),  # torch's own pytree deprecations
]
TOLERANCE = 1e-5

if importlib.util.find_spec("torch") is not None:
    import torch
    from torch import nn

    class Mlp(nn.Module):
        """LayerNorm, two dense layers with a GELU."""

        def __init__(self) -> None:
            super().__init__()
            self.norm = nn.LayerNorm(32)
            self.up = nn.Linear(32, 64)
            self.down = nn.Linear(64, 10)

        def forward(self, x: torch.Tensor) -> Any:
            return self.down(nn.functional.gelu(self.up(self.norm(x))))

    class SmallConvNet(nn.Module):
        """Conv, batch norm (eval), max pool, strided conv, global average, dense."""

        def __init__(self) -> None:
            super().__init__()
            self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
            self.bn = nn.BatchNorm2d(8)
            self.conv2 = nn.Conv2d(8, 16, 3, stride=2)
            self.head = nn.Linear(16, 5)

        def forward(self, x: torch.Tensor) -> Any:
            x = nn.functional.max_pool2d(torch.relu(self.bn(self.conv1(x))), 2)
            x = torch.relu(self.conv2(x)).mean(dim=(2, 3))
            return self.head(x)

    class DataDependent(nn.Module):
        """Python control flow on a tensor value: torch.export cannot capture it."""

        def forward(self, x: torch.Tensor) -> Any:
            return x if float(x.sum()) > 0 else -x


def _seeded(module: Any) -> Any:
    module.eval()
    with torch.no_grad():  # non-trivial batch-norm statistics
        for buffer_name, buffer in module.named_buffers():
            if buffer_name.endswith("running_mean"):
                buffer.uniform_(-0.5, 0.5)
            elif buffer_name.endswith("running_var"):
                buffer.uniform_(0.5, 2.0)
    return module


def _torch_reference(module: Any, x: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    with torch.no_grad():
        return np.asarray(module(torch.from_numpy(x)).numpy())


@pytest.fixture(scope="module")
def converted() -> dict[str, tuple[Any, ExportedModel]]:
    """The MLP and the conv net, each converted once with a symbolic batch."""
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        mlp = _seeded(Mlp())
        conv = _seeded(SmallConvNet())
        return {
            "mlp": (mlp, export_torch(mlp, [torch.randn(4, 32)], batch_dim="batch")),
            "conv": (conv, export_torch(conv, [torch.randn(2, 3, 16, 16)], batch_dim="batch")),
        }


@pytest.mark.parametrize(("name", "sample_shape"), [("mlp", (32,)), ("conv", (3, 16, 16))])
def test_converted_module_matches_torch_in_the_sandbox_at_two_batch_sizes(
    sandbox: Sandbox,
    converted: dict[str, tuple[Any, ExportedModel]],
    rng: np.random.Generator,
    name: str,
    sample_shape: tuple[int, ...],
) -> None:
    module, model = converted[name]
    for n in (3, 8):
        x = rng.standard_normal((n, *sample_shape), dtype=np.float32)
        (out,) = run_in_sandbox(sandbox, model, model.envelope(x))
        expected = _torch_reference(module, x)
        assert out.shape == expected.shape
        assert float(np.abs(out - expected).max()) <= TOLERANCE


def test_parameters_and_buffers_are_the_weights_section_with_state_dict_names(
    converted: dict[str, tuple[Any, ExportedModel]],
) -> None:
    module, model = converted["conv"]
    labels = {spec.label for spec in model.signature.weights}
    assert labels == set(module.state_dict())
    assert [spec.label for spec in model.signature.inputs] == ["input0"]
    assert model.signature.inputs[0].shape == ("batch", 3, 16, 16)
    tracked = next(s for s in model.signature.weights if s.label == "bn.num_batches_tracked")
    assert tracked.dtype == "int32"  # int64 buffer shipped as JAX's canonical int32


def test_torchax_imports_on_this_torch_and_the_shim_is_removed_afterwards() -> None:
    from client.models import _torchax_shim

    torchax = _torchax_shim.import_torchax()
    assert torchax.__version__ == "0.0.13"
    if not hasattr(torch.ops.aten.prod, "dim_Dimname"):  # torch dropped named tensors
        assert "aten::prod.dim_Dimname" in _torchax_shim.skipped
    with pytest.raises(AttributeError):
        torch.ops.aten.prod.dim_Dimname  # noqa: B018 - the lookup itself is the test
    with pytest.raises(AttributeError):
        torch.ops.aten.prod.no_such_overload  # noqa: B018


def test_module_that_torch_export_cannot_capture_is_a_conversion_error() -> None:
    with pytest.raises(ModelConversionError, match="DataDependent"):
        export_torch(DataDependent(), [torch.randn(2, 4)])
