"""The alternative PyTorch route: torch_xla's StableHLO export, wrapped as a ``jax.export`` blob.

UNTESTED HERE: torch_xla is not installed in this environment (it needs exactly torch 2.9.0,
is a 7 GB CUDA build on PyPI, and its libtpu pin conflicts with ``jax[tpu]``), so
:func:`export_torch_xla` only runs where someone installed torch_xla in its own environment
(with a CPU ``jax`` of the same version beside it). What *is* tested here is the adapter
:func:`wrap_stablehlo`, fed with a StableHLO module that JAX itself lowered with its arguments
in a foreign order, which is the part that turns any framework's StableHLO into our format.

How it works: torch_xla's ``exported_program_to_stablehlo`` returns a module whose ``@main``
takes parameters, lifted constants and user inputs interleaved (its ``input_locations`` say
which is which). The adapter renames that function to a private ``@_foreign_main``, adds a new
public ``@main`` taking ``(*weights, *inputs)`` in our flat order and calling the old one, and
puts the module into an ``Exported`` whose metadata comes from a template exported by JAX with
the same argument and result types. We never use torch_xla's own saver/loader
(``np.load(allow_pickle=True)``).
"""

from __future__ import annotations

import dataclasses
import importlib.util
from collections.abc import Sequence
from typing import Any, Final, Literal

import numpy as np

from client.errors import ConverterUnavailableError, ModelConversionError
from client.models.jax_export import package_exported
from client.models.program import ExportedModel
from client.models.signature import Array

Source = tuple[Literal["weight", "input"], int]
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


def torch_xla_available() -> bool:
    """Return whether torch_xla can be imported in this environment (without importing it)."""
    return importlib.util.find_spec("torch_xla") is not None


def export_torch_xla(
    module: Any,
    example_inputs: Sequence[Any],
    *,
    platform: str = "cpu",
    input_labels: Sequence[str] | None = None,
) -> ExportedModel:
    """Convert ``module`` through ``torch.export`` and torch_xla's StableHLO export (untested).

    Shapes are static (torch_xla marks dynamic dims its own way; use :func:`export_torch` for
    a symbolic batch). The program is lowered for one ``platform``.
    """
    if not torch_xla_available():
        raise ConverterUnavailableError(
            "torch_xla is not installed; it needs its own environment (torch==2.9.0, "
            "torch-xla==2.9.0, PJRT_DEVICE=CPU). Use export_torch (torchax) here."
        )
    import torch
    from torch_xla.stablehlo import (  # type: ignore[import-not-found, unused-ignore]
        StableHLOExportOptions,
        exported_program_to_stablehlo,
    )

    tensors = tuple(
        x if torch.is_tensor(x) else torch.as_tensor(np.asarray(x)) for x in example_inputs
    )
    module.eval()
    try:
        with torch.no_grad():
            program = torch.export.export(module, tensors)
            graph = exported_program_to_stablehlo(
                program, StableHLOExportOptions(include_human_readable_text=True)
            )
    except Exception as exc:  # torch.export / torch_xla raise many types
        raise ModelConversionError(
            f"torch_xla export failed on {type(module).__name__}: {type(exc).__name__}: {exc}"
        ) from exc
    bundle = graph._bundle
    function = bundle.stablehlo_funcs[0]
    weights: list[Array] = []
    labels: list[str] = []
    sources: list[Source] = []
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
        weights.append(np.asarray(value))
        labels.append(label)
    outputs = [
        (tuple(int(d) for d in sig.shape), str(sig.dtype)) for sig in function.meta.output_signature
    ]
    return wrap_stablehlo(
        function.text,
        weights=weights,
        weight_labels=labels,
        sources=sources,
        example_inputs=[t.detach().cpu().numpy() for t in tensors],
        outputs=outputs,
        platform=platform,
        input_labels=input_labels,
    )


def wrap_stablehlo(
    module_text: str,
    *,
    weights: Sequence[Array],
    weight_labels: Sequence[str],
    sources: Sequence[Source],
    example_inputs: Sequence[Array],
    outputs: Sequence[tuple[tuple[int, ...], str]],
    platform: str = "cpu",
    input_labels: Sequence[str] | None = None,
) -> ExportedModel:
    """Wrap a foreign StableHLO module (text) into a task program taking ``(*weights, *inputs)``.

    ``sources[j]`` says where argument ``j`` of the module's ``@main`` comes from: a weight or
    an input, by index. ``outputs`` are the (shape, dtype) of its results, in order.
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
        base = export.export(jax.jit(template), platforms=(platform,))(*avals)
        flat_sources = [
            index if kind == "weight" else len(weights) + index for kind, index in sources
        ]
        wrapped = _rewire(module_text, [_tensor_type(a) for a in flat], flat_sources)
    except ModelConversionError:
        raise
    except Exception as exc:  # MLIR parse/serialize errors have several types
        raise ModelConversionError(
            f"cannot wrap StableHLO module: {type(exc).__name__}: {exc}"
        ) from exc
    exported = dataclasses.replace(
        base,
        mlir_module_serialized=wrapped,
        module_kept_var_idx=tuple(range(len(flat))),
        uses_global_constants=False,
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


def _tensor_type(array: Array) -> str:
    element = _MLIR_ELEMENT.get(str(array.dtype))
    if element is None:
        raise ModelConversionError(f"no StableHLO element type for dtype {array.dtype}")
    return f"tensor<{''.join(f'{d}x' for d in array.shape)}{element}>"


def _rewire(module_text: str, arg_types: Sequence[str], sources: Sequence[int]) -> bytes:
    """Rename ``@main`` to a private function; add a ``@main`` taking our flat order."""
    from jax._src.interpreters.mlir import make_ir_context  # pinned jax; no public equivalent
    from jax.extend.mlir import ir
    from jax.extend.mlir.dialects import stablehlo

    with make_ir_context():
        module = ir.Module.parse(module_text)
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
        if len(foreign_args) != len(sources):
            raise ModelConversionError(
                f"@main takes {len(foreign_args)} arguments, {len(sources)} sources given"
            )
        for j, (source, wanted) in enumerate(zip(sources, foreign_args, strict=True)):
            if arg_types[source] != wanted:
                raise ModelConversionError(
                    f"argument {j} of @main is {wanted}, its source is {arg_types[source]}"
                )
        main.attributes["sym_name"] = ir.StringAttr.get(_FOREIGN_MAIN)
        main.attributes["sym_visibility"] = ir.StringAttr.get("private")
        params = ", ".join(f"%arg{i}: {t}" for i, t in enumerate(arg_types))
        operands = ", ".join(f"%arg{s}" for s in sources)
        result_list = ", ".join(results)
        call = (
            f"%0:{len(results)} = func.call @{_FOREIGN_MAIN}({operands}) : "
            f"({', '.join(foreign_args)}) -> ({result_list})"
            if len(results) > 1
            else f"%0 = func.call @{_FOREIGN_MAIN}({operands}) : "
            f"({', '.join(foreign_args)}) -> ({result_list})"
        )
        returned = ", ".join(f"%0#{i}" for i in range(len(results))) if len(results) > 1 else "%0"
        new_main = (
            f"  func.func public @main({params}) -> ({result_list}) {{\n"
            f"    {call}\n"
            f"    return {returned} : {result_list}\n"
            "  }\n"
        )
        text = str(module).rstrip()
        if not text.endswith("}"):
            raise ModelConversionError("unexpected StableHLO module text")
        combined = ir.Module.parse(text[:-1] + new_main + "}\n")
        version = stablehlo.get_version_from_compatibility_requirement(
            stablehlo.StablehloCompatibilityRequirement.WEEK_4
        )
        return bytes(stablehlo.serialize_portable_artifact(combined, version, True))
