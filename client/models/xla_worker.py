"""The torch_xla export worker: runs in ``.venv-xla`` (torch 2.9.0 + torch-xla 2.9.0), not here.

Started by :mod:`client.models.from_torch_xla` as ``.venv-xla/bin/python -I xla_worker.py
REQUEST.json``; it imports only the standard library, torch, torch_xla, numpy and safetensors
(never the project's packages, which need JAX and the main environment). Data goes through
files: the request is JSON, arrays are safetensors, and what comes back is JSON plus files in
the request's ``out`` folder. Nothing is pickled.

Request: ``{"jobs": [{"model": "file.py:factory", "inputs": "x.safetensors",
"state_dict": "w.safetensors" | null, "out": "folder"}]}``; the inputs file names its tensors
``"0"``, ``"1"``, ... in ``forward``'s order. For each job the worker builds the module with
``factory()``, loads the state dict (strict), runs ``torch.export.export`` and torch_xla's
``exported_program_to_stablehlo`` on ``PJRT_DEVICE=CPU`` and writes into ``out``:

- ``module.mlir``: the StableHLO module as text;
- ``weights.safetensors``: the parameters and lifted constants, named ``"0"``, ``"1"``, ...;
- ``result.json``: ``{"ok": true, "sources": [["weight", 0], ["input", 0], ...],
  "weight_labels": [...], "outputs": [[shape, dtype], ...], "seconds": {...}}``, where
  ``sources[j]`` says what argument ``j`` of the module's ``@main`` is; or, on a failure,
  ``{"ok": false, "stage": "load" | "export" | "lower", "error_type": ..., "message": ...,
  "traceback": ...}``.

The worker exits 0 when every job wrote its ``result.json`` (failed or not).
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any

MAX_MESSAGE_CHARS = 8000


def _load_factory(spec: str) -> Any:
    path_text, sep, name = spec.rpartition(":")
    if not sep or not path_text or not name.isidentifier():
        raise ValueError(f"model must be 'file.py:factory', got {spec!r}")
    path = Path(path_text).resolve()
    if not path.is_file():
        raise FileNotFoundError(f"no model file {path}")
    module_name = f"_tpumarket_model_{abs(hash(str(path)))}"
    loader_spec = importlib.util.spec_from_file_location(module_name, path)
    if loader_spec is None or loader_spec.loader is None:
        raise ImportError(f"cannot import {path}")
    module = importlib.util.module_from_spec(loader_spec)
    sys.modules[module_name] = module
    loader_spec.loader.exec_module(module)
    factory = getattr(module, name, None)
    if not callable(factory):
        raise AttributeError(f"{path} has no callable {name!r}")
    return factory


def _ordered(tensors: dict[str, Any]) -> list[Any]:
    names = sorted(tensors, key=lambda n: (0, int(n)) if n.isdigit() else (1, n))
    if names != [str(i) for i in range(len(names))]:
        raise ValueError(f"tensors must be named 0..n-1, got {names}")
    return [tensors[n] for n in names]


def _version(name: str) -> str:
    from importlib.metadata import version

    return version(name)


def _fail(out: Path, stage: str, exc: BaseException) -> None:
    result = {
        "ok": False,
        "stage": stage,
        "error_type": f"{type(exc).__module__}.{type(exc).__qualname__}",
        "message": str(exc)[:MAX_MESSAGE_CHARS],
        "traceback": "".join(traceback.format_exception(exc))[-MAX_MESSAGE_CHARS:],
    }
    (out / "result.json").write_text(json.dumps(result))


def export_one(job: dict[str, Any]) -> None:
    """Export one job's module and write its files (or its failure) into its ``out``."""
    import numpy as np
    import safetensors.torch
    import torch

    out = Path(job["out"])
    out.mkdir(parents=True, exist_ok=True)
    seconds: dict[str, float] = {}
    stage = "load"
    try:
        started = time.perf_counter()
        module = _load_factory(str(job["model"]))()
        if not isinstance(module, torch.nn.Module):
            raise TypeError(f"the factory returned {type(module).__name__}, not an nn.Module")
        if job.get("state_dict"):
            module.load_state_dict(safetensors.torch.load_file(job["state_dict"]), strict=True)
        module.eval()
        inputs = tuple(_ordered(safetensors.torch.load_file(job["inputs"])))
        seconds["load"] = time.perf_counter() - started
        stage = "export"
        started = time.perf_counter()
        with torch.no_grad():
            program = torch.export.export(module, inputs)
        seconds["torch_export"] = time.perf_counter() - started
        stage = "lower"
        started = time.perf_counter()
        from torch_xla.stablehlo import StableHLOExportOptions, exported_program_to_stablehlo

        graph = exported_program_to_stablehlo(
            program, StableHLOExportOptions(include_human_readable_text=True)
        )
        seconds["stablehlo"] = time.perf_counter() - started
    except Exception as exc:  # any failure of the user's model is reported, not raised
        _fail(out, stage, exc)
        return
    bundle = graph._bundle
    function = bundle.stablehlo_funcs[0]
    weights: list[Any] = []
    labels: list[str] = []
    sources: list[tuple[str, int]] = []
    for location in function.meta.input_locations:
        kind = getattr(location.type_, "value", str(location.type_))
        if kind == "input_arg":
            sources.append(("input", int(location.position)))
            continue
        if kind == "parameter":
            value, label = bundle.state_dict[location.name], str(location.name)
        else:
            value = bundle.additional_constants[location.position]
            label = f"constant{location.position}"
        sources.append(("weight", len(weights)))
        weights.append(np.ascontiguousarray(np.asarray(value)))
        labels.append(label)
    (out / "module.mlir").write_text(function.text)
    import safetensors.numpy

    safetensors.numpy.save_file(
        {str(i): w for i, w in enumerate(weights)}, out / "weights.safetensors"
    )
    result = {
        "ok": True,
        "sources": sources,
        "weight_labels": labels,
        "outputs": [
            [[int(d) for d in sig.shape], str(sig.dtype)] for sig in function.meta.output_signature
        ],
        "seconds": seconds,
        "versions": {"torch": torch.__version__, "torch_xla": _version("torch_xla")},
    }
    (out / "result.json").write_text(json.dumps(result))


def main(argv: list[str]) -> int:
    """Run every job of the request file named by ``argv[0]``."""
    os.environ.setdefault("PJRT_DEVICE", "CPU")
    request = json.loads(Path(argv[0]).read_text())
    import torch_xla  # noqa: F401 - fails here, before any job, when the environment is broken

    for job in request["jobs"]:
        export_one(job)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
