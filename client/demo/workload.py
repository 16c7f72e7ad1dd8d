"""The demo's workload: TPU v5e compile-checks and Silero VAD inference, by provider."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from client.demo.terms import ALPHA, BETA, TPU_TARGET
from client.errors import ClientError
from client.tasks import TaskSpec
from contracts.messages import KIND_COMPILE, KIND_INFERENCE, Plan
from programs.envelope import ProgramEnvelope


@dataclass(frozen=True)
class Task:
    """A workload item: what it is, for the table, and where it goes."""

    provider: str
    label: str
    spec: TaskSpec
    describe: Callable[[bytes], str] | None = None  # what verified outputs say, for the table


@dataclass(frozen=True)
class Workload:
    """The demo's tasks, by provider name."""

    tasks: dict[str, list[Task]]


def build_workload(say: Callable[[str], None]) -> Workload:
    """Export the Silero VAD model and an over-HBM program; return the tasks to run."""
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    from client.models.zoo.silero_vad import export_silero_vad, initial_state, speech_like_audio

    started = time.monotonic()
    vad = export_silero_vad(batch=4, chunks=32)
    say(
        f"exported Silero VAD (silero-vad 6.2.3 weights, JAX): program {len(vad.program):,} B, "
        f"weights {len(vad.weights or b''):,} B, symbolic batch "
        f"({time.monotonic() - started:.1f} s)"
    )

    def speech(outputs: bytes) -> str:
        try:
            probabilities = vad.decode_outputs(outputs)[0]
        except ClientError as exc:
            return f"outputs undecodable: {exc}"
        return f"speech in {float((probabilities > 0.5).mean()):.0%} of the 32 ms chunks"

    def vad_task(provider: str, clips: int, seed: int, plan: Plan) -> Task:
        audio = speech_like_audio(clips, 32, seed)
        state, context = initial_state(clips)
        return Task(
            provider,
            f"Silero VAD, {clips} clip{'s' if clips > 1 else ''} x 1 s",
            TaskSpec(KIND_INFERENCE, vad.envelope(audio, state, context), plan.inference_price),
            speech,
        )

    alpha = [
        Task(
            "alpha",
            f"compile Silero VAD for {TPU_TARGET}",
            TaskSpec(KIND_COMPILE, vad.compile_envelope(), ALPHA.plan.compile_price, TPU_TARGET),
        ),
        Task(
            "alpha",
            f"compile dense 60000x60000 f32 for {TPU_TARGET}",
            TaskSpec(KIND_COMPILE, over_hbm_envelope(), ALPHA.plan.compile_price, TPU_TARGET),
        ),
    ]
    alpha += [vad_task("alpha", 4, seed, ALPHA.plan) for seed in range(1, 5)]
    beta = [vad_task("beta", clips, 10 + clips, BETA.plan) for clips in (1, 2, 3)]
    beta.append(
        Task(
            "beta",
            f"a {LATE_STEPS // 1_000_000}M-step loop (seconds of CPU; SLO 1 s)",
            TaskSpec(KIND_INFERENCE, late_envelope(), BETA.plan.inference_price),
        )
    )
    return Workload(tasks={"alpha": alpha, "beta": beta})


LATE_STEPS = 500_000_000
"""Steps of the loop beta cannot finish within its SLO: ~9 s on the 2-core host's CPU, more
than beta's 1 s SLO plus the client's 2 s of slack on any CPU we know of."""


def spin(n: Any, x: Any) -> Any:
    """Apply ``sin(y) + 1`` to ``x`` ``n[0]`` times: a loop whose length (device time) each
    task chooses (``n``: int32[1], ``x``: float32 array)."""
    import jax
    import jax.numpy as jnp

    def body(carry: tuple[jax.Array, jax.Array]) -> tuple[jax.Array, jax.Array]:
        i, y = carry
        return i + 1, jnp.sin(y) + 1.0

    return jax.lax.while_loop(lambda c: c[0] < n[0], body, (jnp.int32(0), x))[1]


def late_envelope() -> ProgramEnvelope:
    """Return a CPU program that loops `LATE_STEPS` times (a task no provider delivers in 1 s)."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax import export

    from client.models.jax_export import producer_versions
    from programs.envelope import encode_arrays

    steps = jax.ShapeDtypeStruct((1,), jnp.int32)  # type: ignore[no-untyped-call]
    values = jax.ShapeDtypeStruct((4,), jnp.float32)  # type: ignore[no-untyped-call]
    exported = export.export(jax.jit(spin), platforms=("cpu",))(steps, values)
    inputs = {"0": np.array([LATE_STEPS], np.int32), "1": np.ones(4, np.float32)}
    return ProgramEnvelope.create(
        program=bytes(exported.serialize()),
        inputs=encode_arrays(inputs),
        producer=producer_versions(exported.calling_convention_version),
        platforms=tuple(exported.platforms),
    )


def over_hbm_envelope() -> ProgramEnvelope:
    """Return a program whose 13.4 GiB argument and result do not fit a v5e's 16 GiB HBM."""
    import jax
    import jax.numpy as jnp
    from jax import export

    from client.models.jax_export import producer_versions

    def double(w: jax.Array) -> jax.Array:
        return w * 2

    weights = jax.ShapeDtypeStruct((60_000, 60_000), jnp.float32)  # type: ignore[no-untyped-call]
    exported = export.export(jax.jit(double), platforms=("tpu",))(weights)
    return ProgramEnvelope.create(
        program=bytes(exported.serialize()),
        inputs=b"",
        producer=producer_versions(exported.calling_convention_version),
        platforms=tuple(exported.platforms),
    )
