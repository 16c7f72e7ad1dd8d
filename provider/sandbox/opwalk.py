"""Walk every op of an exported module with ``jax.extend.mlir.ir`` (runs inside a worker)."""

from __future__ import annotations

import re
from typing import Any

from provider.sandbox.checks import TensorType, check_custom_call, check_op, check_op_count

_CONFIG_ENTRY = re.compile(r"(\w+) = (-?\d+) : (?:ui8|i8|i32|i64|ui32)\b")


def walk_module(exported: Any, max_ops: int) -> int:
    """Check every op of ``exported``'s module against the rules; return the op count.

    Parsing the StableHLO bytecode is native code that crafted bytes can crash or hang, so
    call this only in a killable worker.
    """
    from jax._src.interpreters.mlir import make_ir_context  # the dialects JAX registers
    from jax.extend.mlir import ir
    from jax.extend.mlir.dialects import stablehlo

    with make_ir_context() as context:
        module = stablehlo.deserialize_portable_artifact(context, exported.mlir_module_serialized)
        return _walk(module, max_ops, ir)


def _walk(module: Any, max_ops: int, ir: Any) -> int:
    count = 0
    stack: list[Any] = [module.operation]
    while stack:
        operation = stack.pop()
        for region in operation.regions:
            for block in region.blocks:
                for child in block.operations:
                    op = child.operation
                    count += 1
                    if count > max_ops:
                        check_op_count(count, max_ops)
                    name = str(op.name)
                    target: str | None = None
                    if name == "stablehlo.custom_call":
                        try:
                            target = ir.StringAttr(op.attributes["call_target_name"]).value
                        except (KeyError, ValueError):
                            target = None
                    check_op(name, target)
                    if name == "stablehlo.custom_call":
                        check_custom_call(
                            target or "",
                            [_tensor_type(v.type, ir) for v in op.operands],
                            [_tensor_type(v.type, ir) for v in op.results],
                            _backend_config(op),
                        )
                    stack.append(op)
    return count


def _tensor_type(value_type: Any, ir: Any) -> TensorType:
    """Return (static shape or None, element type) of an operand or result type."""
    try:
        tensor = ir.RankedTensorType(value_type)
    except (ValueError, TypeError):
        return None, str(value_type)
    if not tensor.has_static_shape:
        return None, str(tensor.element_type)
    return tuple(int(d) for d in tensor.shape), str(tensor.element_type)


def _backend_config(op: Any) -> dict[str, int]:
    """Return the integer entries of a custom call's ``mhlo.backend_config`` dictionary."""
    try:
        text = str(op.attributes["mhlo.backend_config"])
    except (KeyError, ValueError):
        return {}
    return {name: int(value) for name, value in _CONFIG_ENTRY.findall(text)}
