"""Convert a PyTorch ``nn.Module`` into a task program: ``torch.export``, then torchax, then JAX.

The route: ``torch.export.export`` captures an ATen graph (with a dynamic batch dimension when
asked); torchax interprets that graph with JAX operations; :func:`export_flat` exports the
result like any JAX function. Parameters, buffers and lifted constants become the weights
section (safetensors, labelled with their ``state_dict`` names); the user inputs follow.
"""

from __future__ import annotations

import importlib.util
import sys
import traceback
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from client.errors import ConverterUnavailableError, ModelConversionError, ModelExportError
from client.models.export_diagnosis import (
    ExportCategory,
    ExportDiagnosis,
    ExportFailed,
    diagnose_export,
    with_other_route,
)
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
    stage = "export"
    try:
        with torch.no_grad():
            program = torch.export.export(module, tensors, dynamic_shapes=dynamic_shapes)
            stage = "lower"
            names, states, func = torchax.export.exported_program_to_jax(program, export_raw=True)
    except Exception as exc:  # torch.export raises many error types; all mean "cannot convert"
        text = f"{type(exc).__name__}: {exc}"
        diagnosis = _diagnosed(text, stage, exc, module, tensors)
        raise ExportFailed(diagnosis, text, subject=type(module).__name__) from exc
    weights = [_to_numpy(torch, state) for state in states]
    labels = list(names) + [f"constant{i}" for i in range(len(weights) - len(names))]

    def call(*flat: Any) -> Any:
        return tuple(func(list(flat[: len(weights)]), flat[len(weights) :]))

    try:  # torchax looks its lowerings up while JAX traces the graph
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
    except ModelExportError as exc:
        cause = exc.__cause__ or exc
        text = f"{type(cause).__name__}: {cause}"
        diagnosis = _diagnosed(text, "lower", cause, module, tensors)
        raise ExportFailed(diagnosis, text, subject=type(module).__name__) from exc


def runs_in_eager(module: Any, example_inputs: Sequence[Any]) -> bool:
    """Whether ``module`` runs in eager PyTorch on ``example_inputs`` (then an export failure is
    the route's, not the model's)."""
    torch = _import_torch()
    tensors = [
        torch.as_tensor(np.asarray(x)) if not torch.is_tensor(x) else x for x in example_inputs
    ]
    try:
        with torch.no_grad():
            module.eval()(*tensors)
    except Exception:  # the user's model may raise anything: it does not run
        return False
    return True


def _diagnosed(
    text: str, stage: str, exc: BaseException, module: Any, tensors: Sequence[Any]
) -> ExportDiagnosis:
    """Diagnose a torchax failure; a generic one in torchax's own step (not `torch.export`,
    which torch_xla runs too) of a model that runs in eager offers the other route."""
    diagnosis = diagnose_export(text, route="torchax", stage=stage, context=_frames(exc))
    generic = diagnosis.category is ExportCategory.OTHER and stage == "lower"
    if generic and runs_in_eager(module, tensors):
        return with_other_route(diagnosis)
    return diagnosis


def _frames(exc: BaseException) -> str:
    """Return the tracebacks of ``exc`` and its causes as text (the rules read its file names)."""
    return "".join(traceback.format_exception(exc))


def load_module(spec: str, state_dict: Mapping[str, Any] | None = None) -> Any:
    """Build the ``nn.Module`` that ``"path/to/file.py:factory"`` names, in this process.

    ``state_dict`` (arrays or tensors by name) is loaded strictly. The file runs as Python:
    only name files you trust. Raise :class:`ExportFailed` (category ``model_load``).
    """
    torch = _import_torch()
    try:
        path_text, sep, name = spec.rpartition(":")
        if not sep or not path_text or not name.isidentifier():
            raise ValueError(f"model must be 'path/to/file.py:factory', got {spec!r}")
        path = Path(path_text).resolve()
        if not path.is_file():
            raise FileNotFoundError(f"no model file {path}")
        module_name = f"_tpumarket_model_{path.stem}_{abs(hash(str(path)))}"
        loader = importlib.util.spec_from_file_location(module_name, path)
        if loader is None or loader.loader is None:
            raise ImportError(f"cannot import {path}")
        source = importlib.util.module_from_spec(loader)
        sys.modules[module_name] = source
        loader.loader.exec_module(source)
        factory = getattr(source, name, None)
        if not callable(factory):
            raise AttributeError(f"{path} has no callable {name!r}")
        module = factory()
        if not isinstance(module, torch.nn.Module):
            raise TypeError(f"{spec} returned {type(module).__name__}, not an nn.Module")
        if state_dict is not None:
            module.load_state_dict(
                {k: torch.as_tensor(np.asarray(v)) for k, v in state_dict.items()}, strict=True
            )
    except Exception as exc:  # the user's file may raise anything
        text = f"{type(exc).__name__}: {exc}"
        diagnosis = diagnose_export(
            text, route="torchax", stage="load", category=ExportCategory.MODEL_LOAD
        )
        raise ExportFailed(diagnosis, text) from exc
    return module.eval()


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
