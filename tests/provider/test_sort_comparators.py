"""A sort whose comparator is no strict weak order is refused before XLA's CPU sort runs it.

XLA's CPU sort reads outside its buffer when ``comp(a, a)`` is true (a ``<=`` comparator:
signals 6 and 11, "double free or corruption"). The validator refuses the forms it can tell:
a single compare LE/GE/EQ/NE, a constant true, the negation of LT/GT. The strict comparators
JAX writes itself (``jnp.sort``, ``argsort``, multi-key ``lax.sort``) still pass.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import export

from programs.envelope import ProgramEnvelope
from programs.opwalk import walk_module
from programs.refusals import Category, RejectedProgram
from provider.sandbox import Sandbox
from tests.provider.helpers import failed, outputs, ran
from tests.provider.programs import envelope_for, export_fn, spec, with_module_text

I32 = jnp.int32
LT_COMPARE = re.compile(r"stablehlo\.compare\s+LT,")


def _int_sort() -> export.Exported:
    return export_fn(lambda a: jax.lax.sort(a, is_stable=True), spec(64, dtype=I32))


def _crafted(direction: str) -> tuple[export.Exported, bytes]:
    """The int32 sort with its comparator's LT turned into ``direction``."""
    exported = _int_sort()
    text = exported.mlir_module()
    assert len(LT_COMPARE.findall(text)) == 1, text
    return exported, with_module_text(
        exported, LT_COMPARE.sub(f"stablehlo.compare {direction},", text)
    )


def _walk(blob: bytes) -> int:
    return walk_module(export.deserialize(bytearray(blob)), 8000)


@pytest.mark.parametrize(
    "fn",
    [
        lambda a: jnp.sort(a.astype(jnp.float32)),
        lambda a: jnp.argsort(a),
        lambda a: jax.lax.sort((a, a * 2), num_keys=2),
        lambda a: jax.lax.sort(a, is_stable=True),
        lambda a: jnp.sort(a)[::-1],
    ],
)
def test_strict_comparators_jax_writes_pass(fn: Callable[[Any], Any]) -> None:
    exported = export_fn(fn, spec(64, dtype=I32))
    assert _walk(bytes(exported.serialize())) > 0


@pytest.mark.parametrize("direction", ["LE", "GE", "EQ", "NE"])
def test_non_strict_compare_is_refused(direction: str) -> None:
    _, blob = _crafted(direction)
    with pytest.raises(RejectedProgram, match=f"strict weak order.*compare {direction}") as caught:
        _walk(blob)
    assert caught.value.category is Category.UNSUPPORTED_OP
    assert caught.value.op == "stablehlo.sort" and caught.value.hints


def test_constant_true_comparator_is_refused() -> None:
    exported = _int_sort()
    text = exported.mlir_module()
    compare = re.search(r"(%\w+) = stablehlo\.compare\s+LT,[^\n]*\n", text)
    assert compare is not None
    crafted = text.replace(
        compare.group(0), f"{compare.group(1)} = stablehlo.constant dense<true> : tensor<i1>\n"
    )
    with pytest.raises(RejectedProgram, match="constant true"):
        _walk(with_module_text(exported, crafted))


def test_le_sort_fails_as_the_client_s_refusal_and_the_worker_serves_on(
    sandbox: Sandbox,
) -> None:
    """Through the real sandbox: refused with the hint, never run; the next sort runs."""
    exported, blob = _crafted("LE")
    x = np.arange(64, dtype=np.int32)[::-1].copy()
    envelope = envelope_for(exported, [x], program=blob)
    assert isinstance(envelope, ProgramEnvelope)
    failure = failed(sandbox.run(envelope), Category.UNSUPPORTED_OP)
    assert "strict weak order" in failure.diagnosis.message
    assert any("a strict comparator" in hint for hint in failure.diagnosis.hints or ())
    result = ran(sandbox.run(envelope_for(exported, [x])))
    np.testing.assert_array_equal(outputs(result)[0], np.sort(x))


def test_a_crash_hint_does_not_blame_custom_calls() -> None:
    """Custom calls pass an allowlist before anything runs: a crash hint must not blame them."""
    from provider.diagnosis import diagnose

    (hint,) = diagnose(Category.WORKER_CRASH, "worker killed by signal 11").hints or ()
    assert "custom call" not in hint and "jax.export" in hint
