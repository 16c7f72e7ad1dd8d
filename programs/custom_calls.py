"""The custom calls a provider accepts, each checked against the buffers its code reads and writes.

Pure (no JAX): :mod:`programs.opwalk` feeds :func:`check_custom_call` each allowed custom
call's operand and result types, as the module states them.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Final

from programs.refusals import Category, RejectedProgram

Shape = tuple[int, ...]
TensorType = tuple[Shape | None, str]  # (static shape or None, element type as MLIR prints it)

# Custom calls that compile to XLA-owned code or to a CPU LAPACK kernel, each checked by
# :func:`check_custom_call` against the shapes and dtypes its code reads and writes (a kernel
# trusts its buffers: an undersized result buffer is a heap overflow). Deliberately absent:
# host callbacks (xla_python_*_callback, xla_ffi_python_*), Pallas/Mosaic kernels
# (tpu_custom_call, mosaic_gpu*), Triton, tf.call_tf_function, and the GPU solver kernels
# (cusolver_*, hipsolver_*, cusparse_*, cu_*/hip_*), whose buffer rules are not checked here.
ALLOWED_CUSTOM_CALLS: Final = frozenset(
    {
        "AllocateBuffer",
        "ApproxTopK",
        "Eigh",
        "LuDecomposition",
        "ProductOfElementaryHouseholderReflectors",
        "Qr",
        "SPMDFullToShardShape",
        "SPMDShardToFullShape",
        "Sharding",
        "annotate_device_placement",
        "shape_assertion",
    }
)
_SOLVER_KERNEL = re.compile(
    r"^lapack_([sdcz])(gees|geev|gehrd|geqrf|gesdd|getrf|gtsv|heevd|hetrd|orgqr|"
    r"ungqr|potrf|syevd|sytrd|trsm)_ffi$"
)
_ELEMENT = {"s": "f32", "d": "f64", "c": "complex<f32>", "z": "complex<f64>"}
_REAL = {"s": "f32", "d": "f64", "c": "f32", "z": "f64"}
_COMPLEX = {"s": "complex<f32>", "d": "complex<f64>", "c": "complex<f32>", "z": "complex<f64>"}


def is_allowed_target(target: str) -> bool:
    """Whether a custom call to ``target`` may appear at all (its buffers are checked apart)."""
    return target in ALLOWED_CUSTOM_CALLS or _SOLVER_KERNEL.match(target) is not None


def _fmt(shape: Shape | None) -> str:
    return "?" if shape is None else "x".join(str(d) for d in shape) or "scalar"


class _Call:
    """One custom call's operand and result types, checked one expectation at a time."""

    def __init__(
        self,
        target: str,
        operands: Sequence[TensorType],
        results: Sequence[TensorType],
        config: Mapping[str, int],
    ) -> None:
        self.target = target
        self.operands = list(operands)
        self.results = list(results)
        self.config = config

    def refuse(self, why: str) -> RejectedProgram:
        return RejectedProgram(
            Category.MALFORMED_INPUT, f"custom call {self.target}: {why}", op=self.target
        )

    def arity(self, operands: int, results: int) -> None:
        if len(self.operands) != operands or len(self.results) != results:
            raise self.refuse(
                f"takes {operands} operands and gives {results} results, not "
                f"{len(self.operands)} and {len(self.results)}"
            )

    def static(self) -> None:
        for kind, types in (("operand", self.operands), ("result", self.results)):
            for index, (shape, _) in enumerate(types):
                if shape is None or any(d < 0 for d in shape):
                    raise self.refuse(f"{kind} {index} has no static shape")

    def expect(self, kind: str, index: int, shape: Shape, dtype: str) -> None:
        got_shape, got_dtype = (self.operands if kind == "operand" else self.results)[index]
        if got_shape != shape or got_dtype != dtype:
            raise self.refuse(
                f"{kind} {index} is {_fmt(got_shape)} {got_dtype}, the kernel reads or "
                f"writes {_fmt(shape)} {dtype}"
            )

    def matrix(self, index: int = 0) -> tuple[Shape, int, int]:
        shape = self.operands[index][0]
        assert shape is not None
        if len(shape) < 2:
            raise self.refuse(f"operand {index} is {_fmt(shape)}, not a (batch of) matrices")
        return shape[:-2], shape[-2], shape[-1]

    def option(self, name: str, allowed: str) -> str:
        value = self.config.get(name)
        if value is None or not 0 <= value < 128 or chr(value) not in allowed:
            raise self.refuse(f"attribute {name}={value} is not one of {', '.join(allowed)}")
        return chr(value)


def _check_lapack(call: _Call, letter: str, kernel: str) -> None:
    """Check a jaxlib CPU LAPACK kernel's buffers (see jaxlib/cpu/lapack_kernels.cc)."""
    t, r, c, i32 = _ELEMENT[letter], _REAL[letter], _COMPLEX[letter], "i32"
    real = letter in "sd"
    if kernel == "getrf":
        call.arity(1, 3)
        b, m, n = call.matrix()
        call.expect("operand", 0, (*b, m, n), t)
        call.expect("result", 0, (*b, m, n), t)
        call.expect("result", 1, (*b, min(m, n)), i32)
        call.expect("result", 2, b, i32)
    elif kernel == "geqrf":
        call.arity(1, 2)
        b, m, n = call.matrix()
        call.expect("operand", 0, (*b, m, n), t)
        call.expect("result", 0, (*b, m, n), t)
        call.expect("result", 1, (*b, min(m, n)), t)
    elif kernel in ("orgqr", "ungqr"):
        if (kernel == "orgqr") != real:
            raise call.refuse(f"{kernel} does not take {t}")
        call.arity(2, 1)
        b, m, n = call.matrix()
        tau = call.operands[1][0] or ()
        k = tau[-1] if len(tau) == len(b) + 1 else -1
        if not 0 <= k <= n <= m:
            raise call.refuse(f"needs taus of k <= n <= m, got {_fmt(tau)} for {m}x{n}")
        call.expect("operand", 0, (*b, m, n), t)
        call.expect("operand", 1, (*b, k), t)
        call.expect("result", 0, (*b, m, n), t)
    elif kernel == "potrf":
        call.arity(1, 2)
        call.option("uplo", "LU")
        b, n, _ = call.matrix()
        call.expect("operand", 0, (*b, n, n), t)
        call.expect("result", 0, (*b, n, n), t)
        call.expect("result", 1, b, i32)
    elif kernel in ("syevd", "heevd"):
        if (kernel == "syevd") != real:
            raise call.refuse(f"{kernel} does not take {t}")
        call.arity(1, 3)
        call.option("mode", "NV")
        call.option("uplo", "LU")
        b, n, _ = call.matrix()
        call.expect("operand", 0, (*b, n, n), t)
        call.expect("result", 0, (*b, n, n), t)
        call.expect("result", 1, (*b, n), r)
        call.expect("result", 2, b, i32)
    elif kernel == "gesdd":
        call.arity(1, 5)
        mode = call.option("mode", "ASN")
        b, m, n = call.matrix()
        k = min(m, n)
        u, vt = ((m, k), (k, n)) if mode == "S" else ((m, m), (n, n))
        call.expect("operand", 0, (*b, m, n), t)
        call.expect("result", 0, (*b, m, n), t)
        call.expect("result", 1, (*b, k), r)
        call.expect("result", 2, (*b, *u), t)
        call.expect("result", 3, (*b, *vt), t)
        call.expect("result", 4, b, i32)
    elif kernel == "geev":
        call.option("compute_left", "NV")
        call.option("compute_right", "NV")
        b, n, _ = call.matrix()
        call.arity(1, 5 if real else 4)
        call.expect("operand", 0, (*b, n, n), t)
        values = [(*b, n)] * (2 if real else 1)
        for index, shape in enumerate(values):
            call.expect("result", index, shape, t)
        call.expect("result", len(values), (*b, n, n), c)
        call.expect("result", len(values) + 1, (*b, n, n), c)
        call.expect("result", len(values) + 2, b, i32)
    elif kernel == "gees":
        call.option("mode", "NV")
        if call.option("sort", "NS") == "S":  # the CPU kernel has no eigenvalue ordering
            raise RejectedProgram(
                Category.UNSUPPORTED_OP,
                f"custom call {call.target}: a Schur decomposition with sorted eigenvalues "
                "(sort_eig_vals=True) is not implemented on CPU",
                op=call.target,
            )
        b, n, _ = call.matrix()
        call.arity(1, 6 if real else 5)
        call.expect("operand", 0, (*b, n, n), t)
        call.expect("result", 0, (*b, n, n), t)
        call.expect("result", 1, (*b, n, n), t)
        count = 2 if real else 1
        for index in range(count):
            call.expect("result", 2 + index, (*b, n), t)
        call.expect("result", 2 + count, b, i32)
        call.expect("result", 3 + count, b, i32)
    elif kernel == "gehrd":
        call.arity(1, 3)
        b, n, _ = call.matrix()
        low, high = call.config.get("low"), call.config.get("high")
        if low is None or high is None or not 1 <= low <= max(1, high) <= max(1, n):
            raise call.refuse(f"needs 1 <= low <= high <= {n}, got low={low} high={high}")
        call.expect("operand", 0, (*b, n, n), t)
        call.expect("result", 0, (*b, n, n), t)
        call.expect("result", 1, (*b, max(n - 1, 0)), t)
        call.expect("result", 2, b, i32)
    elif kernel in ("sytrd", "hetrd"):
        if (kernel == "sytrd") != real:
            raise call.refuse(f"{kernel} does not take {t}")
        call.arity(1, 5)
        call.option("uplo", "LU")
        b, n, _ = call.matrix()
        call.expect("operand", 0, (*b, n, n), t)
        call.expect("result", 0, (*b, n, n), t)
        call.expect("result", 1, (*b, n), r)
        call.expect("result", 2, (*b, max(n - 1, 0)), r)
        call.expect("result", 3, (*b, max(n - 1, 0)), t)
        call.expect("result", 4, b, i32)
    elif kernel == "trsm":
        call.arity(2, 1)
        side = call.option("side", "LR")
        call.option("uplo", "LU")
        call.option("trans_x", "NTC")
        call.option("diag", "NU")
        b, m, n = call.matrix(1)
        k = m if side == "L" else n
        call.expect("operand", 0, (*b, k, k), t)
        call.expect("operand", 1, (*b, m, n), t)
        call.expect("result", 0, (*b, m, n), t)
    elif kernel == "gtsv":
        call.arity(4, 5)
        b, m, n = call.matrix(3)
        for index in range(3):
            call.expect("operand", index, (*b, m), t)
            call.expect("result", index, (*b, m), t)
        call.expect("operand", 3, (*b, m, n), t)
        call.expect("result", 3, (*b, m, n), t)
        call.expect("result", 4, b, i32)
    else:  # pragma: no cover - the pattern lists only the kernels above
        raise call.refuse("no buffer rule for this kernel")


def _check_xla_owned(call: _Call) -> None:
    """Check the custom calls that XLA itself expands or interprets."""
    target = call.target
    if target in ("Sharding", "SPMDFullToShardShape", "SPMDShardToFullShape"):
        call.arity(1, 1)
        if call.operands[0][1] != call.results[0][1]:
            raise call.refuse("changes the element type")
        if target == "Sharding" and call.operands[0] != call.results[0]:
            raise call.refuse("changes the shape")
    elif target == "annotate_device_placement":
        if call.operands != call.results:
            raise call.refuse("results differ from operands")
    elif target == "shape_assertion":
        call.arity(len(call.operands), 0)
        if not call.operands or call.operands[0] != ((), "i1"):
            raise call.refuse("first operand must be a scalar i1")
    elif target == "AllocateBuffer":
        call.arity(0, 1)
    elif target == "ApproxTopK":
        k = len(call.results)
        call.arity(2 * k, k)
        for index in range(k):
            operand, result = call.operands[index], call.results[index]
            if operand[1] != result[1] or len(operand[0] or ()) != len(result[0] or ()):
                raise call.refuse(f"result {index} does not match operand {index}")
    elif target == "Qr":
        call.arity(1, 2)
        b, m, n = call.matrix()
        call.expect("result", 0, (*b, m, n), call.operands[0][1])
        call.expect("result", 1, (*b, min(m, n)), call.operands[0][1])
    elif target == "Eigh":
        call.arity(1, 2)
        b, n, _ = call.matrix()
        dtype = call.operands[0][1]
        call.expect("operand", 0, (*b, n, n), dtype)
        call.expect("result", 0, (*b, n, n), dtype)
        call.expect("result", 1, (*b, n), dtype.removeprefix("complex<").removesuffix(">"))
    elif target == "LuDecomposition":
        call.arity(1, 3)
        b, m, n = call.matrix()
        call.expect("result", 0, (*b, m, n), call.operands[0][1])
        call.expect("result", 1, (*b, min(m, n)), "i32")
        call.expect("result", 2, (*b, m), "i32")
    elif target == "ProductOfElementaryHouseholderReflectors":
        call.arity(2, 1)
        b, m, n = call.matrix()
        call.expect("result", 0, (*b, m, n), call.operands[0][1])
    else:  # pragma: no cover - ALLOWED_CUSTOM_CALLS lists only the targets above
        raise call.refuse("no buffer rule for this target")


def check_custom_call(
    target: str,
    operands: Sequence[TensorType],
    results: Sequence[TensorType],
    config: Mapping[str, int],
) -> None:
    """Check an allowed custom call's operand and result types against what its code uses.

    ``config`` holds the call's integer ``mhlo.backend_config`` attributes (enum options of
    the LAPACK kernels). Raises :class:`RejectedProgram` (``malformed_input``) on any
    mismatch; call it for every custom call that :func:`check_op` let through.
    """
    call = _Call(target, operands, results, config)
    call.static()
    kernel = _SOLVER_KERNEL.match(target)
    if kernel is not None:
        _check_lapack(call, kernel[1], kernel[2])
    elif target in ALLOWED_CUSTOM_CALLS:
        _check_xla_owned(call)
    else:
        raise call.refuse("not an allowed custom call")
