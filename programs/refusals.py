"""Why a program is refused or a task failed: the categories, their hints, the refusal itself.

Pure (no JAX). A provider's receipts carry :attr:`Category.code` on chain, so the codes are
stable: never renumber them. A refusal raised by the rules (:mod:`programs.rules`) carries its
category, the op it names and, when they differ from the category's own, its hints: the
provider answers with them, and the client's export says the same words before a program
leaves its machine.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Final

from programs.envelope import ProgramError


class Category(StrEnum):
    """Why a task failed."""

    MALFORMED_INPUT = "malformed_input"
    VERSION_MISMATCH = "version_mismatch"
    PLATFORM_MISMATCH = "platform_mismatch"
    DEVICE_COUNT_MISMATCH = "device_count_mismatch"
    UNSUPPORTED_OP = "unsupported_op"
    OOM = "oom"
    BAD_ARGUMENTS = "bad_arguments"
    COMPILE_TIMEOUT = "compile_timeout"
    EXECUTE_TIMEOUT = "execute_timeout"
    WORKER_CRASH = "worker_crash"
    EXECUTE_ERROR = "execute_error"

    @property
    def code(self) -> int:
        """Return the stable on-chain code of this category (1..11; 0 means success)."""
        return _CODES[self]

    @classmethod
    def from_code(cls, code: int) -> Category:
        """Return the category with this on-chain code."""
        for category, value in _CODES.items():
            if value == code:
                return category
        raise ValueError(f"no failure category has code {code}")


_CODES: Final[dict[Category, int]] = {
    Category.MALFORMED_INPUT: 1,
    Category.VERSION_MISMATCH: 2,
    Category.PLATFORM_MISMATCH: 3,
    Category.DEVICE_COUNT_MISMATCH: 4,
    Category.UNSUPPORTED_OP: 5,
    Category.OOM: 6,
    Category.BAD_ARGUMENTS: 7,
    Category.COMPILE_TIMEOUT: 8,
    Category.EXECUTE_TIMEOUT: 9,
    Category.WORKER_CRASH: 10,
    Category.EXECUTE_ERROR: 11,
}


HINTS: Final[dict[Category, tuple[str, ...]]] = {
    Category.MALFORMED_INPUT: (
        "Send the bytes of jax.export.Exported.serialize() unmodified, inside a program "
        "envelope whose hashes match.",
        "Send arguments as safetensors or an npz without object arrays.",
    ),
    Category.VERSION_MISMATCH: (
        "Export with a JAX version within the provider's advertised range, or pin "
        "the calling-convention version with jax.export's default for that version.",
        "Upgrade the exporter if the provider needs a newer calling convention.",
    ),
    Category.PLATFORM_MISMATCH: (
        "Export for the provider's platform: jax.export.export(f, platforms=('tpu',)) for "
        "a TPU target, or list several platforms to run anywhere.",
    ),
    Category.DEVICE_COUNT_MISMATCH: (
        "Export with a mesh of the target's device count, or pick a target topology with "
        "as many devices as the program was exported for.",
    ),
    Category.UNSUPPORTED_OP: (
        "Rewrite the op with XLA-friendly primitives (jax.numpy / jax.lax) instead of custom "
        "calls, host callbacks or hand-written kernels.",
        "Avoid ops the target lacks (e.g. LAPACK-backed linalg on TPU, f64/c128 on TPU).",
    ),
    Category.OOM: (
        "Lower the batch size or sequence length.",
        "Use mixed precision (bfloat16 weights and activations).",
        "Shard the model over more devices, or pick a target with more memory.",
        "Rematerialize activations (jax.checkpoint) to cut temporaries.",
    ),
    Category.BAD_ARGUMENTS: (
        "Send one tensor per flat argument, named by its index, with the exported shapes "
        "and dtypes.",
    ),
    Category.COMPILE_TIMEOUT: (
        "Shrink the program: use lax.scan or fori_loop instead of unrolled Python loops.",
        "Split the model into smaller exported functions.",
    ),
    Category.EXECUTE_TIMEOUT: (
        "Lower the batch size or split the work into several tasks.",
        "Check for loops whose trip count depends on the data.",
    ),
    Category.WORKER_CRASH: (
        "The program crashed the runtime (only its own worker died): export it with jax.export "
        "from unedited JAX code and check it runs locally on the same JAX version.",
    ),
    Category.EXECUTE_ERROR: (
        "The program raised an error while it ran (the runtime survived): run it locally "
        "with the same inputs and check its runtime assertions.",
    ),
}
"""Each category's own hints (a refusal or diagnosis without hints of its own gives these)."""


class RejectedProgram(ProgramError):
    """A program fails a rule; ``category`` names which kind, ``op`` what it names."""

    def __init__(
        self,
        category: Category,
        message: str,
        op: str | None = None,
        *,
        hints: tuple[str, ...] | None = None,
    ) -> None:
        """Record why the program was refused (``hints``: other than the category's own)."""
        super().__init__(message)
        self.category = category
        self.op = op
        self.hints = hints

    @property
    def advice(self) -> tuple[str, ...]:
        """The hints a provider answers this refusal with (its own, else its category's)."""
        return HINTS[self.category] if self.hints is None else self.hints
