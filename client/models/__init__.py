"""Models: export JAX functions and PyTorch modules into task programs, build inputs, decode.

Importing this package does not import JAX, torch or onnx; the export functions do, when
called. See ``docs/models.md`` for the routes and the decisions behind them.
"""

from client.models.from_torch import export_torch
from client.models.from_torch_xla import export_torch_xla
from client.models.jax_export import DEFAULT_PLATFORMS, export_flat, export_jax, run_local
from client.models.program import ExportedModel, decode_outputs, encode_inputs
from client.models.signature import ProgramSignature, TensorSpec
from client.models.xla_env import torch_xla_available

__all__ = [
    "DEFAULT_PLATFORMS",
    "ExportedModel",
    "ProgramSignature",
    "TensorSpec",
    "decode_outputs",
    "encode_inputs",
    "export_flat",
    "export_jax",
    "export_torch",
    "export_torch_xla",
    "run_local",
    "torch_xla_available",
]
