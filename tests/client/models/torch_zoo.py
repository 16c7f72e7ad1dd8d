"""PyTorch modules for the export tests, built by factories (``file.py:factory`` specs).

This file runs in two environments: the main one (torch 2.13, the torchax route and the eager
reference) and ``.venv-xla`` (torch 2.9, the torch_xla worker). It imports only torch, so the
worker can load it by path. Each factory seeds torch, so both environments build the same
architecture; the tests also pass the main environment's state dict, so the weights agree
to the bit.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

# ---- models that export --------------------------------------------------------------------


class Mlp(nn.Module):
    """LayerNorm, two dense layers with a GELU."""

    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(32)
        self.up = nn.Linear(32, 64)
        self.down = nn.Linear(64, 10)

    def forward(self, x: torch.Tensor) -> Any:
        return self.down(nn.functional.gelu(self.up(self.norm(x))))


class ConvNet(nn.Module):
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


class TransformerBlock(nn.Module):
    """Pre-norm self-attention (4 heads) and a GELU feed-forward, both residual."""

    def __init__(self, width: int = 64, heads: int = 4) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(width)
        self.attention = nn.MultiheadAttention(width, heads, batch_first=True)
        self.norm2 = nn.LayerNorm(width)
        self.feed = nn.Sequential(
            nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width)
        )

    def forward(self, x: torch.Tensor) -> Any:
        h = self.norm1(x)
        x = x + self.attention(h, h, h, need_weights=False)[0]
        return x + self.feed(self.norm2(x))


def _seeded(module: nn.Module) -> nn.Module:
    with torch.no_grad():  # non-trivial batch-norm statistics
        for name, buffer in module.named_buffers():
            if name.endswith("running_mean"):
                buffer.uniform_(-0.5, 0.5)
            elif name.endswith("running_var"):
                buffer.uniform_(0.5, 2.0)
    return module.eval()


def make_mlp() -> nn.Module:
    """The MLP; input (batch, 32)."""
    torch.manual_seed(0)
    return _seeded(Mlp())


def make_conv() -> nn.Module:
    """The conv net; input (batch, 3, 16, 16)."""
    torch.manual_seed(1)
    return _seeded(ConvNet())


def make_transformer() -> nn.Module:
    """The transformer block; input (batch, 16 tokens, 64)."""
    torch.manual_seed(2)
    return _seeded(TransformerBlock())


class SileroVad(nn.Module):
    """Silero VAD v6 (16 kHz) in PyTorch, named so the trained weights load as a state dict.

    The same network as ``client.models.zoo.silero_vad`` (which reads the weights out of the
    ``silero-vad`` wheel's ONNX file): per 512-sample chunk with 64 samples of context, an STFT
    as a strided conv, four conv1d + ReLU, an LSTM cell carried across chunks, ReLU, a 1x1 conv
    and a sigmoid. ``forward(audio (B, N*512), state (2, B, 128), context (B, 64))`` returns
    the per-chunk speech probabilities (B, N) and the state and context to continue with.
    """

    def __init__(self) -> None:
        super().__init__()
        self.stft = nn.Module()
        self.stft.register_buffer("forward_basis_buffer", torch.zeros(258, 1, 256))
        self.encoder = nn.ModuleList()
        for c_in, c_out, stride in ((129, 128, 1), (128, 64, 2), (64, 64, 2), (64, 128, 1)):
            layer = nn.Module()
            layer.reparam_conv = nn.Conv1d(c_in, c_out, 3, stride=stride, padding=1)
            self.encoder.append(layer)
        self.decoder = nn.Module()
        self.decoder.rnn = nn.LSTMCell(128, 128)
        self.decoder.decoder = nn.Sequential(nn.Dropout(0.1), nn.ReLU(), nn.Conv1d(128, 1, 1))

    def forward(self, audio: torch.Tensor, state: torch.Tensor, context: torch.Tensor) -> Any:
        h, c = state[0], state[1]
        probs = []
        for start in range(0, audio.shape[1], 512):
            chunk = audio[:, start : start + 512]
            x = nn.functional.pad(
                torch.cat([context, chunk], dim=1)[:, None, :], (0, 64), "reflect"
            )
            spectrum = nn.functional.conv1d(x, self.stft.forward_basis_buffer, stride=128)
            real, imag = spectrum[:, :129], spectrum[:, 129:]
            y = torch.sqrt(real**2 + imag**2)
            for layer in self.encoder:
                y = torch.relu(layer.reparam_conv(y))
            h, c = self.decoder.rnn(y[:, :, 0], (h, c))
            probs.append(torch.sigmoid(self.decoder.decoder(h[:, :, None]))[:, 0, 0])
            context = chunk[:, -64:]
        return torch.stack(probs, dim=1), torch.stack([h, c]), context


def make_silero_vad() -> nn.Module:
    """The Silero VAD architecture; load the trained weights as its state dict."""
    return SileroVad().eval()


# ---- models that cannot be exported, one per kind of failure -----------------------------


class NoLowering(nn.Module):
    """An ATen op with no lowering to StableHLO (eigenvalues of a general matrix)."""

    def forward(self, x: torch.Tensor) -> Any:
        return torch.linalg.eigvals(x).real


class DynamicShape(nn.Module):
    """Output size depends on the values: boolean masking."""

    def forward(self, x: torch.Tensor) -> Any:
        return x[x > 0] * 2


class DataDependentBranch(nn.Module):
    """Python control flow on a tensor's value."""

    def forward(self, x: torch.Tensor) -> Any:
        if x.sum() > 0:
            return x * 2
        return -x


@torch.library.custom_op("tpumarket_test::fused_gelu", mutates_args=(), device_types="cuda")
def fused_gelu(x: torch.Tensor) -> torch.Tensor:
    """A custom op with a CUDA kernel only, like an extension's fused kernel."""
    return nn.functional.gelu(x)


@fused_gelu.register_fake
def _(x: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)


class CustomOp(nn.Module):
    """Calls the CUDA-only custom op."""

    def forward(self, x: torch.Tensor) -> Any:
        return fused_gelu(x) + 1


def make_no_lowering() -> nn.Module:
    """Eigenvalues; input (4, 4)."""
    return NoLowering()


def make_dynamic_shape() -> nn.Module:
    """Boolean masking; input (8,)."""
    return DynamicShape()


def make_data_dependent_branch() -> nn.Module:
    """An ``if`` on a tensor; input (8,)."""
    return DataDependentBranch()


def make_custom_op() -> nn.Module:
    """A custom op; input (8,)."""
    return CustomOp()
