"""Export a JAX function into a task program; run a program locally for spot checks.

JAX is imported inside the functions, so ``import client.models`` stays cheap.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Final

import numpy as np
import numpy.typing as npt

from client.errors import ModelExportError, ProgramInputsError
from client.models.program import ExportedModel
from client.models.signature import Array, Dim, ProgramSignature, TensorSpec
from programs.envelope import ProducerVersions, ProgramEnvelope, encode_arrays

if TYPE_CHECKING:
    import jax

DEFAULT_PLATFORMS: Final = ("cpu", "tpu")
"""Lower for both: the program runs on CPU providers and compiles for TPU targets."""


def export_jax(
    fn: Callable[..., Any],
    *,
    example_inputs: Sequence[npt.ArrayLike],
    weights: Any = None,
    batch_dim: str | None = None,
    batch_axes: Sequence[int | None] | None = None,
    input_labels: Sequence[str] | None = None,
    platforms: Sequence[str] = DEFAULT_PLATFORMS,
) -> ExportedModel:
    """Export ``fn`` into a task program with its weights in their own section.

    ``fn`` is called as ``fn(weights, *inputs)`` when ``weights`` (any pytree of arrays) is
    given, else ``fn(*inputs)``. Flat arguments are the weight leaves in ``jax.tree_util``
    order, then the inputs. ``batch_dim`` names a symbolic dimension placed at axis
    ``batch_axes[i]`` of input ``i`` (default: axis 0 of every input; ``None`` leaves an
    input unbatched), so one program serves every batch size.
    """
    import jax

    leaves_with_paths = (
        jax.tree_util.tree_flatten_with_path(weights)[0] if weights is not None else []
    )
    weight_arrays = [np.asarray(leaf) for _, leaf in leaves_with_paths]
    weight_labels = [jax.tree_util.keystr(path) or "weights" for path, _ in leaves_with_paths]
    treedef = jax.tree_util.tree_structure(weights) if weights is not None else None

    def call(*flat: Any) -> Any:
        if treedef is None:
            return fn(*flat)
        tree = jax.tree_util.tree_unflatten(treedef, flat[: len(weight_arrays)])
        return fn(tree, *flat[len(weight_arrays) :])

    call.__name__ = call.__qualname__ = _name(fn)  # errors and debug info name the user's fn

    return export_flat(
        call,
        weights=weight_arrays,
        weight_labels=weight_labels,
        example_inputs=example_inputs,
        batch_dim=batch_dim,
        batch_axes=batch_axes,
        input_labels=input_labels,
        platforms=platforms,
    )


def export_flat(
    fn: Callable[..., Any],
    *,
    weights: Sequence[Array],
    weight_labels: Sequence[str],
    example_inputs: Sequence[npt.ArrayLike],
    batch_dim: str | None = None,
    batch_axes: Sequence[int | None] | None = None,
    input_labels: Sequence[str] | None = None,
    platforms: Sequence[str] = DEFAULT_PLATFORMS,
) -> ExportedModel:
    """Export ``fn(*weights, *inputs)`` (flat arrays only); the core of every route."""
    import jax
    from jax import export

    inputs = tuple(np.ascontiguousarray(np.asarray(x)) for x in example_inputs)
    labels = (
        list(input_labels)
        if input_labels is not None
        else [f"input{i}" for i in range(len(inputs))]
    )
    if len(labels) != len(inputs) or len(weight_labels) != len(weights):
        raise ModelExportError("one label per input and per weight is needed")
    axes = _batch_axes(inputs, batch_dim, batch_axes)
    symbol = export.symbolic_shape(batch_dim)[0] if batch_dim is not None else None

    def spec(array: Array, axis: int | None) -> jax.ShapeDtypeStruct:
        shape: list[Any] = list(array.shape)
        if axis is not None:
            shape[axis] = symbol
        return jax.ShapeDtypeStruct(tuple(shape), array.dtype)  # type: ignore[no-untyped-call]

    weight_specs = [jax.ShapeDtypeStruct(w.shape, w.dtype) for w in weights]  # type: ignore[no-untyped-call]
    input_specs = [spec(x, axis) for x, axis in zip(inputs, axes, strict=True)]
    try:
        exported = export.export(jax.jit(fn), platforms=tuple(platforms))(
            *weight_specs, *input_specs
        )
    except Exception as exc:  # tracing and lowering raise many types; all mean "cannot export"
        raise ModelExportError(f"cannot export {_name(fn)}: {type(exc).__name__}: {exc}") from exc
    return package_exported(
        exported,
        weights=weights,
        weight_labels=weight_labels,
        example_inputs=inputs,
        input_labels=labels,
    )


def package_exported(
    exported: Any,
    *,
    weights: Sequence[Array],
    weight_labels: Sequence[str],
    example_inputs: Sequence[Array],
    input_labels: Sequence[str],
) -> ExportedModel:
    """Wrap a ``jax.export.Exported`` taking ``(*weights, *inputs)`` flat into a model."""
    n_weights = len(weights)
    if len(exported.in_avals) != n_weights + len(example_inputs):
        raise ModelExportError(
            f"exported function takes {len(exported.in_avals)} flat arguments, expected "
            f"{n_weights} weights + {len(example_inputs)} inputs (inputs must be arrays, "
            "not pytrees)"
        )
    # JAX canonicalizes 64-bit types (x64 off): ship arrays in the dtypes the program takes.
    weights = [
        _as_canonical(w, aval.dtype) for w, aval in zip(weights, exported.in_avals, strict=False)
    ]
    inputs = tuple(
        _as_canonical(x, aval.dtype)
        for x, aval in zip(example_inputs, exported.in_avals[n_weights:], strict=True)
    )
    signature = ProgramSignature(
        weights=tuple(
            TensorSpec(i, label, _dims(aval.shape), str(aval.dtype))
            for i, (label, aval) in enumerate(zip(weight_labels, exported.in_avals, strict=False))
        ),
        inputs=tuple(
            TensorSpec(n_weights + i, label, _dims(aval.shape), str(aval.dtype))
            for i, (label, aval) in enumerate(
                zip(input_labels, exported.in_avals[n_weights:], strict=True)
            )
        ),
        outputs=tuple(
            TensorSpec(i, f"output{i}", _dims(aval.shape), str(aval.dtype))
            for i, aval in enumerate(exported.out_avals)
        ),
    )
    weights_bytes = (
        encode_arrays({str(i): np.ascontiguousarray(w) for i, w in enumerate(weights)})
        if weights
        else None
    )
    return ExportedModel(
        program=bytes(exported.serialize()),
        weights=weights_bytes,
        signature=signature,
        producer=producer_versions(exported.calling_convention_version),
        platforms=tuple(exported.platforms),
        example_inputs=inputs,
    )


def producer_versions(calling_convention: int) -> ProducerVersions:
    """Return this process's JAX and jaxlib versions with ``calling_convention``."""
    import jax
    import jaxlib

    return ProducerVersions(
        jax=jax.__version__,
        jaxlib=str(getattr(jaxlib, "__version__", jax.__version__)),
        calling_convention=calling_convention,
    )


def run_local(envelope: ProgramEnvelope) -> list[Array]:
    """Execute a (trusted) envelope in this process on JAX's default CPU device.

    This is the spot-check re-execution: only run programs this client exported or
    otherwise trusts, since a blob can reach any custom call registered in jaxlib.
    """
    import jax
    from jax import export

    exported = export.deserialize(bytearray(envelope.program))
    arguments = envelope.arguments()
    count = len(exported.in_avals)
    names = {str(i) for i in range(count)}
    if set(arguments) != names:
        raise ProgramInputsError(
            f"envelope carries tensors {sorted(arguments)}, the program takes 0..{count - 1}"
        )
    flat = [arguments[str(i)] for i in range(count)]
    args, kwargs = jax.tree_util.tree_unflatten(exported.in_tree, flat)
    with jax.default_device(jax.devices("cpu")[0]):
        result = exported.call(*args, **kwargs)  # type: ignore[no-untyped-call]
    return [np.asarray(leaf) for leaf in jax.tree_util.tree_leaves(result)]


def _batch_axes(
    inputs: Sequence[Array], batch_dim: str | None, batch_axes: Sequence[int | None] | None
) -> list[int | None]:
    if batch_dim is None:
        if batch_axes is not None:
            raise ModelExportError("batch_axes given without batch_dim")
        return [None] * len(inputs)
    if not batch_dim.isidentifier():
        raise ModelExportError(f"batch_dim must be an identifier, got {batch_dim!r}")
    axes = list(batch_axes) if batch_axes is not None else [0] * len(inputs)
    if len(axes) != len(inputs):
        raise ModelExportError(f"{len(axes)} batch axes for {len(inputs)} inputs")
    sizes = set()
    for x, axis in zip(inputs, axes, strict=True):
        if axis is None:
            continue
        if not -x.ndim <= axis < x.ndim:
            raise ModelExportError(f"batch axis {axis} out of range for shape {x.shape}")
        sizes.add(x.shape[axis])
    if len(sizes) > 1:
        raise ModelExportError(f"example inputs disagree on the batch size: {sorted(sizes)}")
    return [None if a is None else a % x.ndim for x, a in zip(inputs, axes, strict=True)]


def _as_canonical(array: Array, dtype: Any) -> Array:
    if array.dtype == dtype:
        return array
    return np.ascontiguousarray(array.astype(dtype))


def _dims(shape: Sequence[Any]) -> tuple[Dim, ...]:
    return tuple(d if isinstance(d, int) else str(d) for d in shape)


def _name(fn: Callable[..., Any]) -> str:
    return getattr(fn, "__qualname__", None) or type(fn).__name__
