"""Convert a PyTorch ``nn.Module`` into a task program: ``torch.export``, then torchax, then JAX.

The route: ``torch.export.export`` captures an ATen graph (with a dynamic batch dimension when
asked); torchax interprets that graph with JAX operations; :func:`export_flat` exports the
result like any JAX function. Parameters, buffers and lifted constants become the weights
section (safetensors, labelled with their ``state_dict`` names); the user inputs follow.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from client.errors import ConverterUnavailableError, ModelConversionError
from client.models.jax_export import DEFAULT_PLATFORMS, export_flat
from client.models.program import ExportedModel
from client.models.signature import Array


def export_torch(
    module: Any,
    example_inputs: Sequence[Any],
    *,
    batch_dim: str | None = None,
    batch_axes: Sequence[int | None] | None = None,
    input_labels: Sequence[str] | None = None,
    platforms: Sequence[str] = DEFAULT_PLATFORMS,
) -> ExportedModel:
    """Convert ``module`` (a ``torch.nn.Module``, put in eval mode) into a task program.

    ``example_inputs`` are tensors or arrays, one per positional argument of ``forward``.
    ``batch_dim`` makes axis ``batch_axes[i]`` (default 0) of each input dynamic in
    ``torch.export`` and symbolic in the JAX export; give an example batch of at least 2,
    since ``torch.export`` specializes sizes 0 and 1.
    """
    torch = _import_torch()
    from client.models._torchax_shim import import_torchax

    try:
        import_torchax()
        import torchax.export  # already imported by the shim; binds the name
    except ImportError as exc:
        raise ConverterUnavailableError(
            "torchax is not installed: pip install torchax==0.0.13"
        ) from exc

    tensors = tuple(
        torch.as_tensor(np.asarray(x)) if not torch.is_tensor(x) else x for x in example_inputs
    )
    dynamic_shapes = _dynamic_shapes(torch, tensors, batch_dim, batch_axes)
    module.eval()
    try:
        with torch.no_grad():
            program = torch.export.export(module, tensors, dynamic_shapes=dynamic_shapes)
        names, states, func = torchax.export.exported_program_to_jax(program, export_raw=True)
    except Exception as exc:  # torch.export raises many error types; all mean "cannot convert"
        raise ModelConversionError(
            f"torch.export/torchax failed on {type(module).__name__}: {type(exc).__name__}: {exc}"
        ) from exc
    weights = [_to_numpy(torch, state) for state in states]
    labels = list(names) + [f"constant{i}" for i in range(len(weights) - len(names))]

    def call(*flat: Any) -> Any:
        return tuple(func(list(flat[: len(weights)]), flat[len(weights) :]))

    return export_flat(
        call,
        weights=weights,
        weight_labels=labels,
        example_inputs=[_to_numpy(torch, t) for t in tensors],
        batch_dim=batch_dim,
        batch_axes=batch_axes,
        input_labels=input_labels,
        platforms=platforms,
    )


def _import_torch() -> Any:
    try:
        import torch
    except ImportError as exc:
        raise ConverterUnavailableError(
            "PyTorch is not installed: pip install torch==2.13.0 (the CPU build)"
        ) from exc
    return torch


def _dynamic_shapes(
    torch: Any,
    tensors: tuple[Any, ...],
    batch_dim: str | None,
    batch_axes: Sequence[int | None] | None,
) -> tuple[dict[int, Any] | None, ...] | None:
    if batch_dim is None:
        return None
    axes = list(batch_axes) if batch_axes is not None else [0] * len(tensors)
    if len(axes) != len(tensors):
        raise ModelConversionError(f"{len(axes)} batch axes for {len(tensors)} inputs")
    dim = torch.export.Dim(batch_dim)
    return tuple(
        None if axis is None else {axis % t.dim(): dim}
        for t, axis in zip(tensors, axes, strict=True)
    )


def _to_numpy(torch: Any, value: Any) -> Array:
    if torch.is_tensor(value):
        return np.ascontiguousarray(value.detach().cpu().numpy())
    return np.asarray(value)
