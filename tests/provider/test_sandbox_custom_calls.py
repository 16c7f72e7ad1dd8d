"""Allowed custom calls are checked against the buffers their kernels read and write.

Crafted LAPACK getrf programs with undersized or mistyped result buffers are refused in the
validate stage, before anything compiles or runs, and the worker is not replaced; the same
module with the types JAX emits runs; every LAPACK kernel JAX lowers linalg to on CPU passes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from provider.diagnosis import Category, Stage
from provider.sandbox import Sandbox
from tests.provider.helpers import compiled, failed, outputs, ran
from tests.provider.programs import envelope_for, export_fn, getrf_blob, spec, with_module_text


def test_honest_getrf_module_runs(sandbox: Sandbox, rng: np.random.Generator) -> None:
    base, blob = getrf_blob()
    x = rng.standard_normal((8, 8)).astype(np.float32)
    (info,) = outputs(ran(sandbox.run(envelope_for(base, [x], program=blob))))
    assert info.tolist() == [0] * 8  # LAPACK's info: the factorization succeeded


@pytest.mark.parametrize(
    ("crafted", "says"),
    [
        (
            {"results": ("tensor<2x2xf32>", "tensor<8xi32>", "tensor<i32>")},
            "result 0 is 2x2 f32, the kernel reads or writes 8x8 f32",
        ),
        (
            {"results": ("tensor<8x8xf32>", "tensor<1xi32>", "tensor<i32>")},
            "result 1 is 1 i32, the kernel reads or writes 8 i32",
        ),
        (
            {"results": ("tensor<8x8xf16>", "tensor<8xi32>", "tensor<i32>")},
            "result 0 is 8x8 f16",
        ),
        (
            {
                "target": "lapack_dgetrf_ffi",
                "results": ("tensor<8x8xf32>", "tensor<8xi32>", "tensor<i32>"),
            },
            "operand 0 is 8x8 f32, the kernel reads or writes 8x8 f64",
        ),
        (
            {
                "operand": "tensor<8x8xf16>",
                "results": ("tensor<8x8xf32>", "tensor<8xi32>", "tensor<i32>"),
            },
            "operand 0 is 8x8 f16",
        ),
    ],
)
def test_crafted_getrf_buffers_are_refused_before_compile(
    sandbox: Sandbox, crafted: dict[str, Any], says: str
) -> None:
    base, blob = getrf_blob(**crafted)
    replacements = sandbox.replacements
    failure = failed(
        sandbox.run(envelope_for(base, [np.ones((8, 8), np.float32)], program=blob)),
        Category.MALFORMED_INPUT,
    )
    assert failure.diagnosis.stage is Stage.VALIDATE
    assert "lapack_" in failure.diagnosis.message and says in failure.diagnosis.message
    assert sandbox.replacements == replacements  # refused, not crashed


LINALG: dict[str, Callable[[jax.Array], Any]] = {
    "lu": lambda a: jax.lax.linalg.lu(a[..., :4, :]),
    "qr": jnp.linalg.qr,
    "qr_complete": lambda a: jnp.linalg.qr(a, mode="complete"),
    "cholesky": lambda a: jnp.linalg.cholesky(a[..., :4, :]),
    "eigh": lambda a: jnp.linalg.eigh(a[..., :4, :]),
    "eigvalsh": lambda a: jnp.linalg.eigvalsh(a[..., :4, :]),
    "svd": jnp.linalg.svd,
    "svd_reduced": lambda a: jnp.linalg.svd(a, full_matrices=False),
    "svd_values": lambda a: jnp.linalg.svd(a, compute_uv=False),
    "eig": lambda a: jnp.linalg.eig(a[..., :4, :]),
    "eigvals": lambda a: jnp.linalg.eigvals(a[..., :4, :]),
    "solve_left": lambda a: jax.lax.linalg.triangular_solve(
        jnp.concatenate([a, a[..., :1]], axis=-1), a, left_side=True
    ),
    "solve_right": lambda a: jax.lax.linalg.triangular_solve(a[..., :4, :], a),
    "schur": lambda a: jax.scipy.linalg.schur(a[..., :4, :]),
    "hessenberg": lambda a: jax.scipy.linalg.hessenberg(a[..., :4, :], calc_q=True),
    "tridiagonal": lambda a: jax.lax.linalg.tridiagonal(a[..., :4, :]),
    "tridiagonal_solve": lambda a: jax.lax.linalg.tridiagonal_solve(
        a[..., 0], a[..., 1], a[..., 2], a
    ),
}


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.complex64], ids=["f32", "c64"])
@pytest.mark.parametrize("name", sorted(LINALG))
def test_every_cpu_lapack_kernel_passes_its_check(sandbox: Sandbox, name: str, dtype: Any) -> None:
    fn = LINALG[name]
    exported = export_fn(lambda a: tuple(jax.tree.leaves(fn(a))), spec(2, 5, 4, dtype=dtype))
    assert "lapack_" in exported.mlir_module()
    zeros = np.zeros((2, 5, 4), np.dtype(dtype))
    compiled(sandbox.compile(envelope_for(exported, [zeros])))


def test_schur_with_sorted_eigenvalues_is_refused_as_unsupported_before_it_runs(
    sandbox: Sandbox,
) -> None:
    # JAX will not lower it, but a crafted module can ask the kernel for sorted eigenvalues,
    # which it answers UNIMPLEMENTED only once the task runs: refused up front instead, as an
    # unsupported operation (the program is well formed; this backend lacks the option).
    exported = export_fn(lambda a: tuple(jax.scipy.linalg.schur(a)), spec(4, 4))
    text = exported.mlir_module()
    assert "sort = 78 : ui8" in text  # 'N'
    blob = with_module_text(exported, text.replace("sort = 78 : ui8", "sort = 83 : ui8"))
    replacements = sandbox.replacements
    failure = failed(
        sandbox.run(envelope_for(exported, [np.eye(4, dtype=np.float32)], program=blob)),
        Category.UNSUPPORTED_OP,
    )
    assert "sorted eigenvalues" in failure.diagnosis.message
    assert failure.diagnosis.stage is Stage.VALIDATE
    assert sandbox.replacements == replacements
