"""The torch_xla PyTorch route: export in the ``.venv-xla`` environment, wrap it for JAX here.

torch_xla 2.9.0 needs exactly torch 2.9.0 and its TPU extra pins a libtpu that conflicts with
``jax[tpu]``, so it lives in its own environment (``.venv-xla`` from ``requirements-xla.txt``,
built on first use by :mod:`client.models.xla_env` or by ``make setup-xla``).
:func:`export_torch_xla` starts that environment's Python on
:mod:`client.models.xla_worker` with a JSON request; the worker builds the module from a
``file.py:factory`` spec (a live module cannot cross environments without pickle), runs
``torch.export`` and torch_xla's ``exported_program_to_stablehlo`` on ``PJRT_DEVICE=CPU``,
and writes the StableHLO text, the weights (safetensors) and JSON metadata into a folder.
Nothing is pickled, and torch_xla's own saver/loader (``np.load(allow_pickle=True)``) is never
used. Back here, :func:`wrap_stablehlo` makes the module a task program.

How the wrap works: torch_xla's ``@main`` takes parameters, lifted constants and user inputs
interleaved (its ``input_locations`` say which is which). The adapter renames that function to
a private ``@_foreign_main``, adds a public ``@main`` taking ``(*weights, *inputs)`` in our
flat order (plus JAX's platform index when the program targets several platforms) and calling
the old one, and puts the module into an ``Exported`` whose metadata comes from a template
exported by JAX with the same argument and result types.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Final, Literal

import numpy as np

from client.errors import ModelConversionError
from client.models.export_diagnosis import ExportCategory, ExportFailed, diagnose_export
from client.models.jax_export import DEFAULT_PLATFORMS, package_exported
from client.models.program import ExportedModel
from client.models.signature import Array
from client.models.xla_env import ensure_torch_xla
from programs.envelope import ArrayFormat, decode_arrays, encode_arrays

Source = tuple[Literal["weight", "input"], int]
WORKER: Final = Path(__file__).with_name("xla_worker.py")
ROUTE: Final = "torch_xla"
_FOREIGN_MAIN: Final = "_foreign_main"
_MLIR_ELEMENT: Final = {
    "float16": "f16",
    "bfloat16": "bf16",
    "float32": "f32",
    "float64": "f64",
    "int8": "i8",
    "int16": "i16",
    "int32": "i32",
    "int64": "i64",
    "uint8": "ui8",
    "uint32": "ui32",
    "bool": "i1",
}


@dataclasses.dataclass(frozen=True, slots=True)
class XlaJob:
    """One module to export: ``model`` is ``"path/to/file.py:factory"``.

    ``example_inputs`` are one array per positional argument of ``forward`` (shapes are
    static on this route); ``state_dict`` (optional) is loaded into the module, strictly.
    """

    model: str
    example_inputs: Sequence[Any]
    state_dict: Mapping[str, Any] | None = None
    input_labels: Sequence[str] | None = None


def export_torch_xla(
    model: str,
    example_inputs: Sequence[Any],
    *,
    state_dict: Mapping[str, Any] | None = None,
    platforms: Sequence[str] = DEFAULT_PLATFORMS,
    input_labels: Sequence[str] | None = None,
    timeout_s: float = 600.0,
) -> ExportedModel:
    """Export ``model`` (``"file.py:factory"``) through torch_xla into a task program.

    Raise :class:`ExportFailed` (with a diagnosis) when the module cannot be exported, and
    :class:`ConverterUnavailableError` when the torch_xla environment is missing.
    """
    job = XlaJob(model, example_inputs, state_dict, input_labels)
    (result,) = export_torch_xla_many([job], platforms=platforms, timeout_s=timeout_s)
    if isinstance(result, ExportFailed):
        raise result
    return result


def export_torch_xla_many(
    jobs: Sequence[XlaJob],
    *,
    platforms: Sequence[str] = DEFAULT_PLATFORMS,
    timeout_s: float = 600.0,
) -> list[ExportedModel | ExportFailed]:
    """Export several modules with one start of the torch_xla environment (about 10 s saved
    per module); return, in order, each program or the diagnosed failure."""
    python = ensure_torch_xla()
    with tempfile.TemporaryDirectory(prefix="tpumarket-xla-") as tmp:
        folder = Path(tmp)
        inputs = [[_as_array(x) for x in job.example_inputs] for job in jobs]
        request = {
            "jobs": [_write_job(folder / str(i), job, inputs[i]) for i, job in enumerate(jobs)]
        }
        (folder / "request.json").write_text(json.dumps(request))
        try:
            done = subprocess.run(
                [str(python), "-I", str(WORKER), str(folder / "request.json")],
                capture_output=True,
                text=True,
                timeout=timeout_s,
                env={**os.environ, "PJRT_DEVICE": "CPU"},
                check=False,
            )
        except subprocess.TimeoutExpired as exc:
            raise ModelConversionError(f"torch_xla export took over {timeout_s:.0f} s") from exc
        return [
            _collect(folder / str(i), job, inputs[i], platforms, done) for i, job in enumerate(jobs)
        ]


def _as_array(value: Any) -> Array:
    if hasattr(value, "detach"):  # a torch tensor from this environment's torch
        value = value.detach().cpu().numpy()
    return np.ascontiguousarray(np.asarray(value))


def _write_job(folder: Path, job: XlaJob, inputs: list[Array]) -> dict[str, Any]:
    folder.mkdir()
    (folder / "inputs.safetensors").write_bytes(
        encode_arrays({str(i): x for i, x in enumerate(inputs)})
    )
    state = None
    if job.state_dict is not None:
        state = str(folder / "state_dict.safetensors")
        Path(state).write_bytes(
            encode_arrays({name: _as_array(v) for name, v in job.state_dict.items()})
        )
    return {
        "model": str(job.model),
        "inputs": str(folder / "inputs.safetensors"),
        "state_dict": state,
        "out": str(folder / "out"),
    }


def _collect(
    folder: Path,
    job: XlaJob,
    inputs: list[Array],
    platforms: Sequence[str],
    done: subprocess.CompletedProcess[str],
) -> ExportedModel | ExportFailed:
    result_file = folder / "out" / "result.json"
    if not result_file.is_file():
        text = (done.stderr or done.stdout or f"exit status {done.returncode}")[-8000:]
        return ExportFailed(
            diagnose_export(text, route=ROUTE, category=ExportCategory.WORKER_CRASH), text
        )
    result = json.loads(result_file.read_text())
    if not result["ok"]:
        text = f"{result['error_type']}: {result['message']}"
        forced = ExportCategory.MODEL_LOAD if result["stage"] == "load" else None
        diagnosis = diagnose_export(text, route=ROUTE, stage=result["stage"], category=forced)
        return ExportFailed(diagnosis, result["traceback"])
    weights_map = decode_arrays(
        (folder / "out" / "weights.safetensors").read_bytes(), ArrayFormat.SAFETENSORS
    )
    weights = [weights_map[str(i)] for i in range(len(weights_map))]
    try:
        return wrap_stablehlo(
            (folder / "out" / "module.mlir").read_text(),
            weights=weights,
            weight_labels=result["weight_labels"],
            sources=[(kind, int(index)) for kind, index in result["sources"]],
            example_inputs=inputs,
            outputs=[(tuple(shape), dtype) for shape, dtype in result["outputs"]],
            platforms=platforms,
            input_labels=job.input_labels,
        )
    except ModelConversionError as exc:
        return ExportFailed(diagnose_export(str(exc), route=ROUTE, stage="wrap"), str(exc))


def wrap_stablehlo(
    module_text: str,
    *,
    weights: Sequence[Array],
    weight_labels: Sequence[str],
    sources: Sequence[Source],
    example_inputs: Sequence[Array],
    outputs: Sequence[tuple[tuple[int, ...], str]],
    platforms: Sequence[str] = ("cpu",),
    input_labels: Sequence[str] | None = None,
) -> ExportedModel:
    """Wrap a foreign StableHLO module (text) into a task program taking ``(*weights, *inputs)``.

    ``sources[j]`` says where argument ``j`` of the module's ``@main`` comes from: a weight or
    an input, by index. ``outputs`` are the (shape, dtype) of its results, in order. 64-bit
    arguments and results are converted from and to JAX's canonical 32-bit types.
    """
    import jax
    import jax.numpy as jnp
    from jax import export

    inputs = [np.asarray(x) for x in example_inputs]
    flat = list(weights) + inputs
    avals = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in flat]  # type: ignore[no-untyped-call]

    def template(*_: Any) -> tuple[jax.Array, ...]:
        return tuple(jnp.zeros(shape, dtype) for shape, dtype in outputs)

    try:
        base = export.export(jax.jit(template), platforms=tuple(platforms))(*avals)
        flat_sources = [
            index if kind == "weight" else len(weights) + index for kind, index in sources
        ]
        wrapped = _rewire(
            module_text,
            [_tensor_type(a.shape, a.dtype) for a in base.in_avals],
            flat_sources,
            [_tensor_type(a.shape, a.dtype) for a in base.out_avals],
            platform_index=len(tuple(platforms)) > 1,
        )
    except ModelConversionError:
        raise
    except Exception as exc:  # MLIR parse/serialize errors have several types
        raise ModelConversionError(
            f"cannot wrap StableHLO module: {type(exc).__name__}: {exc}"
        ) from exc
    exported = dataclasses.replace(
        base, mlir_module_serialized=wrapped, module_kept_var_idx=tuple(range(len(flat)))
    )
    return package_exported(
        exported,
        weights=list(weights),
        weight_labels=weight_labels,
        example_inputs=inputs,
        input_labels=(
            list(input_labels)
            if input_labels is not None
            else [f"input{i}" for i in range(len(inputs))]
        ),
    )


def _tensor_type(shape: Sequence[int], dtype: Any) -> str:
    element = _MLIR_ELEMENT.get(str(np.dtype(dtype)))
    if element is None:
        raise ModelConversionError(f"no StableHLO element type for dtype {dtype}")
    return f"tensor<{''.join(f'{d}x' for d in shape)}{element}>"


# torch_xla writes some elementwise ops as ``custom_call @mhlo.<op>`` (GELU's erf); the same ops
# exist in the CHLO dialect, which providers accept and XLA expands. Opaque custom calls are not.
_MHLO_CALL: Final = re.compile(
    r"stablehlo\.custom_call @mhlo\.(?P<op>erf|erf_inv|lgamma|digamma|acosh|asinh|atanh|cosh|sinh)"
    r"\((?P<arg>%[\w#]+)\)(?: \{(?:[^{}]|\{[^{}]*\})*\})? : "
    r"\((?P<type>tensor<[^>]*>)\) -> (?P<result>tensor<[^>]*>)"
)


def _chlo_for_mhlo_calls(module_text: str) -> str:
    """Return the module with ``custom_call @mhlo.erf(...)`` and its kin as CHLO ops."""
    return _MHLO_CALL.sub(
        lambda m: f"chlo.{m['op']} {m['arg']} : {m['type']} -> {m['result']}", module_text
    )


_NARROWED: Final = {"i64": "i32", "ui64": "ui32", "f64": "f32"}


def _converts(ours: str, theirs: str) -> bool:
    """Return whether ``theirs`` is ``ours`` widened to 64 bits (a canonicalized type)."""
    return any(
        theirs.endswith(f"{wide}>") and ours == f"{theirs[: -len(wide) - 1]}{narrow}>"
        for wide, narrow in _NARROWED.items()
    )


def _rewire(
    module_text: str,
    arg_types: Sequence[str],
    sources: Sequence[int],
    result_types: Sequence[str],
    *,
    platform_index: bool,
) -> bytes:
    """Rename ``@main`` to a private function; add a ``@main`` taking our flat order."""
    from jax._src.interpreters.mlir import make_ir_context  # pinned jax; no public equivalent
    from jax.extend.mlir import ir
    from jax.extend.mlir.dialects import stablehlo

    with make_ir_context():
        module = ir.Module.parse(_chlo_for_mhlo_calls(module_text))
        mains = [
            op
            for op in module.body.operations
            if "sym_name" in op.attributes
            and ir.StringAttr(op.attributes["sym_name"]).value == "main"
        ]
        if len(mains) != 1:
            raise ModelConversionError("the StableHLO module has no single @main function")
        main = mains[0]
        function_type = ir.FunctionType(ir.TypeAttr(main.attributes["function_type"]).value)
        foreign_args = [str(t) for t in function_type.inputs]
        results = [str(t) for t in function_type.results]
        if len(foreign_args) != len(sources) or len(results) != len(result_types):
            raise ModelConversionError(
                f"@main takes {len(foreign_args)} arguments and returns {len(results)}; "
                f"{len(sources)} sources and {len(result_types)} outputs given"
            )
        body: list[str] = []
        operands = []
        for j, (source, wanted) in enumerate(zip(sources, foreign_args, strict=True)):
            ours = arg_types[source]
            if ours == wanted:
                operands.append(f"%arg{source}")
            elif _converts(ours, wanted):
                body.append(f"%in{j} = stablehlo.convert %arg{source} : ({ours}) -> {wanted}")
                operands.append(f"%in{j}")
            else:
                raise ModelConversionError(
                    f"argument {j} of @main is {wanted}, its source is {ours}"
                )
        main.attributes["sym_name"] = ir.StringAttr.get(_FOREIGN_MAIN)
        main.attributes["sym_visibility"] = ir.StringAttr.get("private")
        params = [f"%arg{i}: {t}" for i, t in enumerate(arg_types)]
        if platform_index:
            params.insert(0, '%platform: tensor<i32> {jax.global_constant = "_platform_index"}')
        named = [f"%out#{i}" for i in range(len(results))] if len(results) > 1 else ["%out"]
        prefix = f"%out:{len(results)}" if len(results) > 1 else "%out"
        body.append(
            f"{prefix} = func.call @{_FOREIGN_MAIN}({', '.join(operands)}) : "
            f"({', '.join(foreign_args)}) -> ({', '.join(results)})"
        )
        returned = []
        for i, (theirs, ours) in enumerate(zip(results, result_types, strict=True)):
            if theirs == ours:
                returned.append(named[i])
            elif _converts(ours, theirs):
                body.append(f"%res{i} = stablehlo.convert {named[i]} : ({theirs}) -> {ours}")
                returned.append(f"%res{i}")
            else:
                raise ModelConversionError(f"result {i} of @main is {theirs}, expected {ours}")
        body.append(f"return {', '.join(returned)} : {', '.join(result_types)}")
        new_main = (
            f"  func.func public @main({', '.join(params)}) -> ({', '.join(result_types)}) {{\n"
            + "".join(f"    {line}\n" for line in body)
            + "  }\n"
        )
        text = str(module).rstrip()
        if not text.endswith("}"):
            raise ModelConversionError("unexpected StableHLO module text")
        combined = ir.Module.parse(text[:-1] + new_main + "}\n")
        version = stablehlo.get_version_from_compatibility_requirement(
            stablehlo.StablehloCompatibilityRequirement.WEEK_4
        )
        return bytes(stablehlo.serialize_portable_artifact(combined, version, True))
