"""Named hint sets: hints other than a category's own, sent between worker and parent by name.

Pure text, no logic: a refusal (:class:`programs.refusals.RejectedProgram`) carries one of
them, and the provider's diagnosis chooses among them for what its workers report.
"""

from __future__ import annotations

from typing import Final

OP_COUNT_HINTS: Final = (
    "Shrink the program: use lax.scan or fori_loop instead of unrolled Python loops.",
    "Split the model into smaller exported functions, one task each.",
)
"""Hints of a program refused for having more ops than the provider's cap."""
NESTING_HINTS: Final = (
    "Flatten the nesting: a chain of lax.cond becomes one lax.switch over an index, nested "
    "loops one lax.scan or fori_loop over the combined trip count, and nested jit calls plain "
    "functions (jax.jit only at the top).",
    "Split the model into smaller exported functions, one task each.",
)
"""Hints of a valid program nested deeper than the provider's cap."""
MISSING_OP_HINTS: Final = (
    "Avoid ops the target lacks (e.g. LAPACK-backed linalg on TPU, f64/c128 on TPU), or "
    "rewrite the op with jax.numpy / jax.lax primitives.",
)
"""Hints of an op the compiler refused that is no custom call, callback or kernel."""
COMPILER_ERROR_HINTS: Final = (
    "The compiler refused the program without naming an op: check that it compiles locally "
    "(jax.jit(exported.call).lower(*args).compile()) with the provider's JAX version; the "
    "message is the compiler's own.",
)
"""Hints of a compile failure no rule recognizes."""
VERIFIER_HINTS: Final = (
    "Send jax.export output unedited: its module must verify against the argument shapes and "
    "dtypes it states, under a JAX version in the provider's range.",
)
"""Hints of a module the MLIR verifier refused while lowering it."""
COMPILER_CRASH_HINTS: Final = (
    "The compiler crashed on this program (only its own worker died). A program nested very "
    "deep (control flow in control flow, calls in calls) overflows its stack: chain lax.cond "
    "into one lax.switch, nested loops into one lax.scan. Otherwise check that it compiles "
    "locally on the same JAX version.",
)
"""Hints of a worker that died of a memory fault while compiling."""
KILLED_HINTS: Final = (
    "The worker was killed outright, most often when the host runs out of memory: lower the "
    "batch size or sequence length, or use bfloat16.",
)
"""Hints of a worker killed by SIGKILL that the parent did not kill."""
CPU_LIMIT_HINTS: Final = (
    "The task used up the CPU time one task may use: split the work into several tasks or "
    "lower the batch size.",
)
"""Hints of a worker stopped by its CPU-time limit (SIGXCPU)."""
F64_ON_TPU_HINTS: Final = (
    "TPUs have no float64 or complex128: cast to float32 (or bfloat16) and complex64 before "
    "exporting, or run the program on a CPU or GPU provider.",
)
"""Hints of a program that needs 64-bit floats on a TPU target."""
OUTPUT_DTYPE_HINTS: Final = (
    "Return complex128 results as two float64 arrays (jnp.real, jnp.imag), and sub-byte "
    "integers widened to int8.",
)
"""Hints of a program whose results have a dtype the outputs' format cannot carry."""
SORT_COMPARATOR_HINTS: Final = (
    "Give sort a strict comparator (a < b or a > b, as jnp.sort and lax.sort's own are): "
    "XLA's CPU sort reads outside its buffer when comp(a, a) is true.",
)
"""Hints of a sort refused for a comparator that is no strict weak order."""
HINT_SETS: Final[dict[str, tuple[str, ...]]] = {
    "op_count": OP_COUNT_HINTS,
    "nesting_depth": NESTING_HINTS,
    "missing_op": MISSING_OP_HINTS,
    "compiler_error": COMPILER_ERROR_HINTS,
    "verifier": VERIFIER_HINTS,
    "compiler_crash": COMPILER_CRASH_HINTS,
    "killed": KILLED_HINTS,
    "cpu_limit": CPU_LIMIT_HINTS,
    "sort_comparator": SORT_COMPARATOR_HINTS,
    "f64_on_tpu": F64_ON_TPU_HINTS,
    "output_dtype": OUTPUT_DTYPE_HINTS,
}
"""Hints other than a category's own, by the name a worker sends them under (no free text)."""
