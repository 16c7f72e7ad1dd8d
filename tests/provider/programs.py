"""Real exported models and hostile blobs for the provider tests (runs in the test process)."""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import export
from jax.extend.mlir.dialects import stablehlo

from programs.envelope import (
    ProducerVersions,
    ProgramEnvelope,
    encode_arrays,
)

F32 = jnp.float32
PRODUCER_JAX = jax.__version__


def envelope_for(
    exported: export.Exported,
    args: Sequence[np.ndarray[Any, Any]] = (),
    *,
    weights: dict[int, np.ndarray[Any, Any]] | None = None,
    producer_jax: str = PRODUCER_JAX,
    program: bytes | None = None,
) -> ProgramEnvelope:
    """Wrap an exported program and its flat arguments (index-named) in an envelope."""
    weights = weights or {}
    inputs = {str(i): a for i, a in enumerate(args) if i not in weights and a is not None}
    return ProgramEnvelope.create(
        program=program if program is not None else bytes(exported.serialize()),
        inputs=encode_arrays(inputs) if inputs else b"",
        weights=encode_arrays({str(i): w for i, w in weights.items()}) if weights else None,
        producer=ProducerVersions(
            jax=producer_jax,
            jaxlib=producer_jax,
            calling_convention=exported.calling_convention_version,
        ),
        platforms=tuple(exported.platforms),
    )


def spec(*shape: int | str, dtype: Any = F32) -> jax.ShapeDtypeStruct:
    """Return an abstract argument; string dims are symbolic."""
    dims: list[Any] = []
    for d in shape:
        dims.extend(export.symbolic_shape(d) if isinstance(d, str) else [d])
    return jax.ShapeDtypeStruct(tuple(dims), dtype)


def export_fn(
    fn: Callable[..., Any], *specs: jax.ShapeDtypeStruct, platforms: tuple[str, ...] | None = None
) -> export.Exported:
    """Export ``fn`` for the given abstract arguments."""
    return export.export(jax.jit(fn), platforms=platforms)(*specs)


# ---- real models -------------------------------------------------------------------------


def mlp(w1: jax.Array, b1: jax.Array, w2: jax.Array, b2: jax.Array, x: jax.Array) -> jax.Array:
    """A two-layer perceptron."""
    return jax.nn.relu(x @ w1 + b1) @ w2 + b2


def mlp_params(
    rng: np.random.Generator, d_in: int = 32, d_h: int = 64, d_out: int = 10
) -> list[np.ndarray[Any, Any]]:
    """Random MLP weights."""
    return [
        rng.standard_normal((d_in, d_h), dtype=np.float32) / np.float32(np.sqrt(d_in)),
        rng.standard_normal((d_h,), dtype=np.float32) * 0.1,
        rng.standard_normal((d_h, d_out), dtype=np.float32) / np.float32(np.sqrt(d_h)),
        rng.standard_normal((d_out,), dtype=np.float32) * 0.1,
    ]


def _layer_norm(x: jax.Array, g: jax.Array) -> jax.Array:
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) * jax.lax.rsqrt(var + 1e-5) * g


def transformer_block(
    wq: jax.Array,
    wk: jax.Array,
    wv: jax.Array,
    wo: jax.Array,
    g1: jax.Array,
    w_up: jax.Array,
    w_down: jax.Array,
    g2: jax.Array,
    x: jax.Array,
) -> jax.Array:
    """A pre-norm causal multi-head self-attention block with a GELU MLP (4 heads)."""
    heads = 4
    b, t, d = x.shape
    h = _layer_norm(x, g1)

    def split(y: jax.Array) -> jax.Array:
        return y.reshape(b, t, heads, d // heads).transpose(0, 2, 1, 3)

    q, k, v = split(h @ wq), split(h @ wk), split(h @ wv)
    scores = q @ k.transpose(0, 1, 3, 2) / jnp.sqrt(d // heads)
    mask = jnp.tril(jnp.ones((t, t), bool))
    attn = jax.nn.softmax(jnp.where(mask, scores, -1e9), axis=-1)
    y = (attn @ v).transpose(0, 2, 1, 3).reshape(b, t, d)
    x = x + y @ wo
    return x + jax.nn.gelu(_layer_norm(x, g2) @ w_up) @ w_down


def transformer_params(rng: np.random.Generator, d: int = 32) -> list[np.ndarray[Any, Any]]:
    """Random transformer-block weights."""

    def mat(m: int, n: int) -> np.ndarray[Any, Any]:
        return rng.standard_normal((m, n), dtype=np.float32) / np.float32(np.sqrt(m))

    ones = np.ones((d,), np.float32)
    return [mat(d, d), mat(d, d), mat(d, d), mat(d, d), ones, mat(d, 4 * d), mat(4 * d, d), ones]


def long_loop(x: jax.Array) -> jax.Array:
    """A loop whose trip count makes it run for minutes."""

    def body(carry: tuple[jax.Array, jax.Array]) -> tuple[jax.Array, jax.Array]:
        i, y = carry
        return i + 1, jnp.sin(y) + 1.0

    return jax.lax.while_loop(lambda c: c[0] < 2_000_000_000, body, (jnp.int32(0), x))[1]


def op_bomb(x: jax.Array) -> jax.Array:
    """Ten thousand unrolled steps (about 25k StableHLO ops)."""
    for i in range(10_000):
        x = x * 1.0001 + 0.5 if i % 2 else jnp.sin(x)
    return x


# ---- hostile blobs -----------------------------------------------------------------------


def with_module_text(exported: export.Exported, text: str) -> bytes:
    """Return ``exported`` serialized with its StableHLO module replaced by ``text``."""
    version = stablehlo.get_version_from_compatibility_requirement(
        stablehlo.StablehloCompatibilityRequirement.WEEK_4
    )
    from jax._src.interpreters.mlir import make_ir_context
    from jax.extend.mlir import ir

    with make_ir_context():
        parsed = ir.Module.parse(text)
        module = stablehlo.serialize_portable_artifact(parsed, version, True)
    return bytes(dataclasses.replace(exported, mlir_module_serialized=module).serialize())


def host_callback_blob() -> tuple[export.Exported, bytes]:
    """A blob whose module calls a Python host callback (JAX refuses to export these)."""

    def with_callback(x: jax.Array) -> jax.Array:
        return jax.pure_callback(
            lambda a: np.asarray(a) * 2, jax.ShapeDtypeStruct(x.shape, x.dtype), x
        )

    text = str(jax.jit(with_callback).lower(spec(4)).compiler_ir("stablehlo"))
    assert "callback" in text
    base = export_fn(lambda x: x * 2, spec(4))
    return base, with_module_text(base, text)


OUTFEED_MODULE = """
module @jit_f attributes {mhlo.num_partitions = 1 : i32, mhlo.num_replicas = 1 : i32} {
  func.func public @main(%arg0: tensor<4xf32>) -> (tensor<4xf32>) {
    %0 = stablehlo.create_token : !stablehlo.token
    %1 = "stablehlo.outfeed"(%arg0, %0) {outfeed_config = ""}
        : (tensor<4xf32>, !stablehlo.token) -> !stablehlo.token
    return %arg0 : tensor<4xf32>
  }
}
"""


def outfeed_blob() -> tuple[export.Exported, bytes]:
    """A blob whose module writes to the outfeed (which hangs a CPU run forever)."""
    base = export_fn(lambda x: x * 2, spec(4))
    return base, with_module_text(base, OUTFEED_MODULE)


def pallas_blob() -> export.Exported:
    """A real Pallas kernel exported for TPU: a Mosaic ``tpu_custom_call``."""
    from jax.experimental import pallas as pl

    def kernel(x_ref: Any, o_ref: Any) -> None:
        o_ref[...] = x_ref[...] * 2

    def double(x: jax.Array) -> jax.Array:
        return pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(x)

    return export_fn(double, spec(8, 128), platforms=("tpu",))


def mutated_programs(exported: export.Exported, count: int, seed: int = 7) -> list[bytes]:
    """Serialize ``exported`` with random byte flips in its StableHLO bytecode body."""
    rng = random.Random(seed)
    module = exported.mlir_module_serialized
    header = len(b"ML\xefR") + 1 + len("StableHLO_v1.15.0") + 1
    blobs = []
    for _ in range(count):
        data = bytearray(module)
        for _ in range(rng.randint(1, 8)):
            pos = rng.randrange(header, len(data))
            data[pos] = rng.randrange(256)
        blobs.append(
            bytes(dataclasses.replace(exported, mlir_module_serialized=bytes(data)).serialize())
        )
    return blobs


def getrf_module(
    target: str = "lapack_sgetrf_ffi",
    operand: str = "tensor<8x8xf32>",
    results: tuple[str, str, str] = ("tensor<8x8xf32>", "tensor<8xi32>", "tensor<i32>"),
) -> str:
    """A module that calls the LAPACK LU kernel on its 8x8 f32 argument and returns the LU.

    With the default types it is what JAX emits; other ``results`` craft buffers the kernel
    would write past (the kernel trusts the declared types).
    """
    layouts = ", ".join(
        f"dense<[{', '.join(str(i) for i in reversed(range(rank)))}]> : tensor<{rank}xindex>"
        if rank
        else "dense<> : tensor<0xindex>"
        for rank in (_rank(t) for t in results)
    )
    cast = (
        f"%1 = stablehlo.convert %arg0 : (tensor<8x8xf32>) -> {operand}\n"
        if operand != "tensor<8x8xf32>"
        else ""
    )
    source = "%1" if cast else "%arg0"
    return f"""
module @jit_f attributes {{mhlo.num_partitions = 1 : i32, mhlo.num_replicas = 1 : i32}} {{
  func.func public @main(%arg0: tensor<8x8xf32>) -> (tensor<8xi32>) {{
    {cast}%0:3 = stablehlo.custom_call @{target}({source}) {{backend_config = "",
        mhlo.backend_config = {{}}, operand_layouts = [dense<[0, 1]> : tensor<2xindex>],
        result_layouts = [{layouts}]}}
        : ({operand}) -> ({", ".join(results)})
    %3 = stablehlo.broadcast_in_dim %0#2, dims = [] : (tensor<i32>) -> tensor<8xi32>
    return %3 : tensor<8xi32>
  }}
}}
"""


def _rank(tensor_type: str) -> int:
    dims = tensor_type.removeprefix("tensor<").removesuffix(">").split("x")[:-1]
    return len(dims)


def getrf_blob(**kwargs: Any) -> tuple[export.Exported, bytes]:
    """A blob whose module is :func:`getrf_module` (``kwargs`` craft its types)."""
    base = export_fn(lambda x: jnp.zeros(8, jnp.int32) + x[0, 0].astype(jnp.int32), spec(8, 8))
    return base, with_module_text(base, getrf_module(**kwargs))
