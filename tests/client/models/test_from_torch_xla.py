"""The torch_xla route's adapter on a foreign-ordered StableHLO module; the missing environment."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from client.errors import ConverterUnavailableError, ModelConversionError
from client.models import export_torch_xla, torch_xla_available
from client.models.from_torch_xla import wrap_stablehlo
from client.models.xla_env import XLA_PYTHON_ENV
from provider.sandbox import Sandbox
from tests.client.models.helpers import run_in_sandbox

Array = np.ndarray[Any, Any]


def layer(w: jax.Array, b: jax.Array, x: jax.Array) -> tuple[jax.Array, jax.Array]:
    """A dense layer and the input's sum."""
    return jnp.tanh(x @ w + b), x.sum()


def foreign_module(w: Array, b: Array, x: Array) -> str:
    """StableHLO whose @main takes (b, x, w), as torch_xla interleaves its arguments."""
    return str(
        jax.jit(lambda b_, x_, w_: layer(w_, b_, x_)).lower(b, x, w).compiler_ir("stablehlo")
    )


def test_foreign_stablehlo_rewired_to_our_flat_order_runs_in_the_sandbox(
    sandbox: Sandbox, rng: np.random.Generator
) -> None:
    w = rng.standard_normal((3, 5), dtype=np.float32)
    b = rng.standard_normal((5,), dtype=np.float32)
    x = rng.standard_normal((4, 3), dtype=np.float32)
    model = wrap_stablehlo(
        foreign_module(w, b, x),
        weights=[w, b],
        weight_labels=["w", "b"],
        sources=[("weight", 1), ("input", 0), ("weight", 0)],
        example_inputs=[x],
        outputs=[((4, 5), "float32"), ((), "float32")],
    )
    assert [s.index for s in model.signature.inputs] == [2]

    out, total = run_in_sandbox(sandbox, model, model.example_envelope())

    expected_out, expected_total = layer(jnp.asarray(w), jnp.asarray(b), jnp.asarray(x))
    np.testing.assert_allclose(out, np.asarray(expected_out), atol=1e-6)
    np.testing.assert_allclose(total, np.asarray(expected_total), atol=1e-5)


def test_sources_whose_types_do_not_match_the_module_are_rejected(
    rng: np.random.Generator,
) -> None:
    w = rng.standard_normal((3, 5), dtype=np.float32)
    b = rng.standard_normal((5,), dtype=np.float32)
    x = rng.standard_normal((4, 3), dtype=np.float32)
    with pytest.raises(ModelConversionError, match="argument 0 of @main"):
        wrap_stablehlo(
            foreign_module(w, b, x),
            weights=[w, b],
            weight_labels=["w", "b"],
            sources=[("weight", 0), ("input", 0), ("weight", 1)],
            example_inputs=[x],
            outputs=[((4, 5), "float32"), ((), "float32")],
        )


def test_without_the_torch_xla_environment_the_route_says_how_to_get_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv(XLA_PYTHON_ENV, str(tmp_path / "no-such-python"))
    assert not torch_xla_available()
    with pytest.raises(ConverterUnavailableError, match=r"unset it to build \.venv-xla"):
        export_torch_xla("model.py:make", [np.zeros(3, np.float32)])


def test_a_missing_default_environment_is_built_on_first_use_with_a_progress_line(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The build's steps run in order, each announced; the stamp marks the environment done."""
    from client.models import xla_env

    env = tmp_path / ".venv-xla"
    monkeypatch.delenv(XLA_PYTHON_ENV, raising=False)
    monkeypatch.setattr(xla_env, "DEFAULT_ENV", env)
    lines: list[str] = []
    ran: list[list[str]] = []

    def run(command: list[str]) -> int:
        ran.append(command)
        if command[1:3] == ["-m", "venv"]:
            (env / "bin").mkdir(parents=True)
            python = env / "bin" / "python"
            python.write_text("#!/bin/sh\n")
            python.chmod(0o755)
        return 0

    assert not xla_env.torch_xla_available()
    python = xla_env.ensure_torch_xla(progress=lines.append, run=run)
    assert python == env / "bin" / "python"
    assert xla_env.torch_xla_available()
    assert [c[1:3] for c in ran] == [["-m", "venv"], ["-m", "pip"], ["-m", "pip"]]
    assert ran[-1][-2:] == ["-r", str(xla_env.REQUIREMENTS)]
    assert "first use only" in lines[0] and lines[-1] == "the torch_xla environment is ready"
    # Built once: a second call runs nothing.
    xla_env.ensure_torch_xla(progress=lines.append, run=run)
    assert len(ran) == 3


def test_a_failed_build_says_which_step_and_how_to_retry(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from client.models import xla_env

    monkeypatch.delenv(XLA_PYTHON_ENV, raising=False)
    monkeypatch.setattr(xla_env, "DEFAULT_ENV", tmp_path / ".venv-xla")
    with pytest.raises(ConverterUnavailableError, match=r"exit 1 at step 1.*rerun the command"):
        xla_env.ensure_torch_xla(progress=lambda _line: None, run=lambda _command: 1)
    assert not xla_env.torch_xla_available()
