"""Walk every op of an exported module with ``jax.extend.mlir.ir`` against the rules.

A provider runs it inside a killable worker (crafted bytes can crash or hang the parser); the
client's export runs it on the program it just wrote. JAX is imported when a walk starts.
"""

from __future__ import annotations

import re
from typing import Any

from programs.custom_calls import TensorType, check_custom_call
from programs.nesting import CallGraph
from programs.refusals import Category, RejectedProgram
from programs.rules import (
    DEFAULT_MAX_NESTING,
    DEFAULT_MAX_OPS,
    check_nesting,
    check_op,
    check_op_count,
    check_sort_comparator,
)


class UnparsableModule(RejectedProgram):
    """The StableHLO parser refused the module (its worker is not trusted after that)."""


COUNT_BEYOND_CAP = 16
"""Past the op cap, ops are only counted, up to this many times the cap, for the message."""
_CONFIG_ENTRY = re.compile(r"(\w+) = (-?\d+) : (?:ui8|i8|i32|i64|ui32)\b")


def walk_module(
    exported: Any, max_ops: int = DEFAULT_MAX_OPS, max_nesting: int = DEFAULT_MAX_NESTING
) -> int:
    """Check every op of ``exported``'s module against the rules; return the op count.

    The module's nesting (regions in regions, through the functions they call) may be at
    most ``max_nesting`` deep: XLA's compiler recurses once per level, and a deeper valid
    program overflows a worker's stack while compiling. Parsing the StableHLO bytecode is
    native code that crafted bytes can crash or hang: run an untrusted program's walk only in a
    killable process. A module the parser or the IR bindings fail on is an
    :class:`UnparsableModule`; a rule's refusal is a :class:`RejectedProgram`.
    """
    from jax._src.interpreters.mlir import make_ir_context  # the dialects JAX registers
    from jax.extend.mlir import ir
    from jax.extend.mlir.dialects import stablehlo

    try:
        with make_ir_context() as context:
            module = parse_module(context, exported.mlir_module_serialized, ir, stablehlo)
            return _walk(module, max_ops, max_nesting, ir)
    except RejectedProgram:
        raise
    except Exception as exc:  # the parser or the IR bindings failed on these bytes
        raise UnparsableModule(
            Category.MALFORMED_INPUT,
            f"cannot parse the StableHLO module: {type(exc).__name__}: {exc}",
        ) from exc


def parse_module(context: Any, data: bytes, ir: Any, stablehlo: Any) -> Any:
    """Deserialize a portable artifact; a refusal carries the parser's own first error line.

    MLIR reports why it failed (e.g. an unregistered operation's name) to the context's
    diagnostic handlers, not in the exception, which says only that it failed.
    """
    errors: list[str] = []

    def keep(diagnostic: Any) -> bool:
        if diagnostic.severity == ir.DiagnosticSeverity.ERROR and len(errors) < 8:
            errors.append(str(diagnostic.message))
        return True  # handled: nothing goes to the worker's stderr

    handler = context.attach_diagnostic_handler(keep)
    try:
        return stablehlo.deserialize_portable_artifact(context, data)
    except Exception as exc:
        reasons = [e for e in errors if not e.startswith("failed to deserialize")]
        said = "; ".join(reasons[:2] or errors[:1]) or f"{type(exc).__name__}: {exc}"
        raise UnparsableModule(
            Category.MALFORMED_INPUT, f"cannot parse the StableHLO module: {said}"
        ) from exc
    finally:
        handler.detach()


def _walk(module: Any, max_ops: int, max_nesting: int, ir: Any) -> int:
    count = 0
    bound = max_ops * COUNT_BEYOND_CAP
    graph = CallGraph()
    # (op, the function it is in, how many regions deep within that function)
    stack: list[tuple[Any, str, int]] = [(module.operation, "", -1)]
    while stack and count <= bound:
        operation, function, depth = stack.pop()
        for region in operation.regions:
            for block in region.blocks:
                for child in block.operations:
                    op = child.operation
                    count += 1
                    name = str(op.name)
                    if name == "func.func":
                        inner, level = _symbol(op, "sym_name", ir), 0
                    else:
                        inner, level = function, depth + 1
                    graph.reach(inner, level)
                    if name == "func.call":
                        graph.call(function, level, _symbol(op, "callee", ir))
                    stack.append((op, inner, level))
                    if count <= max_ops:
                        _check(op, ir)
    # Past the cap the ops are only counted (up to the bound), so the refusal states the size.
    check_op_count(count, max_ops, counted_all=not stack)
    check_nesting(graph.deepest(max_nesting), max_nesting)
    return count


def _symbol(op: Any, attribute: str, ir: Any) -> str:
    """Return a function's name or a call's callee (empty when the attribute is missing)."""
    try:
        value = op.attributes[attribute]
    except (KeyError, ValueError):
        return ""
    try:
        return str(ir.FlatSymbolRefAttr(value).value)
    except (ValueError, TypeError):
        try:
            return str(ir.StringAttr(value).value)
        except (ValueError, TypeError):
            return str(value)


def _check(op: Any, ir: Any) -> None:
    name = str(op.name)
    target: str | None = None
    if name == "stablehlo.custom_call":
        try:
            target = ir.StringAttr(op.attributes["call_target_name"]).value
        except (KeyError, ValueError):
            target = None
    check_op(name, target)
    if name == "stablehlo.sort":
        check_sort_comparator(_comparator_result(op))
    if name == "stablehlo.custom_call":
        check_custom_call(
            target or "",
            [_tensor_type(v.type, ir) for v in op.operands],
            [_tensor_type(v.type, ir) for v in op.results],
            _backend_config(op),
        )


_DIRECTION = re.compile(r"comparison_direction\s+(\w+)")


def _comparator_result(sort: Any) -> list[tuple[str, str]]:
    """Return what a sort's comparator returns: (op, detail) of the value, then of its maker."""
    try:
        block = sort.regions[0].blocks[0]
        value = list(block.operations)[-1].operation.operands[0]
    except (IndexError, AttributeError):
        return []
    chain: list[tuple[str, str]] = []
    while len(chain) < 2:
        owner = getattr(value.owner, "operation", value.owner)
        name = getattr(owner, "name", None)
        if not isinstance(name, str):
            break  # a block argument: the comparator returns one of its inputs
        detail = ""
        if name == "stablehlo.compare" and "comparison_direction" in owner.attributes:
            found = _DIRECTION.search(str(owner.attributes["comparison_direction"]))
            detail = found.group(1) if found else ""
        elif name == "stablehlo.constant" and "value" in owner.attributes:
            detail = str(owner.attributes["value"])
        chain.append((name, detail))
        if not len(owner.operands):
            break
        value = owner.operands[0]
    return chain


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
