"""The real trained model: silero-vad's weights ported to JAX, against onnxruntime and on TPU."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest

from client.models import ExportedModel
from client.models.zoo import silero_vad
from provider.capacity import tpu_compiler_available
from provider.sandbox import CompileResult, Sandbox
from tests.client.models.helpers import run_in_sandbox

pytestmark = pytest.mark.skipif(
    any(importlib.util.find_spec(m) is None for m in ("silero_vad", "onnx", "onnxruntime")),
    reason="silero-vad==6.2.3 (--no-deps), onnx and onnxruntime are not installed",
)
TOLERANCE = 1e-5
GIB = 1 << 30


@pytest.fixture(scope="module")
def model() -> ExportedModel:
    """The VAD exported once: 4 clips of 32 chunks (1.024 s), symbolic batch."""
    return silero_vad.export_silero_vad(batch=4, chunks=32)


def _max_errors(
    got: list[np.ndarray], want: tuple[np.ndarray, np.ndarray, np.ndarray]
) -> list[float]:
    return [float(np.abs(g - w).max()) for g, w in zip(got, want, strict=True)]


def test_weights_come_from_the_wheels_onnx_file() -> None:
    weights = silero_vad.load_weights()
    assert list(weights) == list(silero_vad.WEIGHT_NAMES)
    assert weights["stft.forward_basis_buffer"].shape == (258, 1, 256)
    assert weights["decoder.rnn.weight_ih"].shape == (512, 128)
    assert sum(w.size for w in weights.values()) == 309_633  # 243,585 + the STFT basis


def test_port_run_in_the_sandbox_matches_onnxruntime_on_speech_like_audio(
    sandbox: Sandbox, model: ExportedModel
) -> None:
    probs, state, context = run_in_sandbox(sandbox, model, model.example_envelope())
    audio, state0, context0 = model.example_inputs
    reference = silero_vad.reference_onnxruntime(audio, state0, context0)

    assert probs.shape == (4, 32) and state.shape == (2, 4, 128)
    assert not np.array_equal(state, state0)
    assert max(_max_errors([probs, state, context], reference)) <= TOLERANCE
    # the trained detector tells syllables from pauses in these clips
    assert (probs > 0.9).any(axis=1).all() and (probs < 0.1).any(axis=1).all()


@pytest.mark.parametrize("clips", [1, 3])
def test_symbolic_batch_serves_other_batch_sizes(
    sandbox: Sandbox, model: ExportedModel, clips: int
) -> None:
    audio = silero_vad.speech_like_audio(clips, 32, seed=clips)
    state, context = silero_vad.initial_state(clips)

    outputs = run_in_sandbox(sandbox, model, model.envelope(audio, state, context))

    reference = silero_vad.reference_onnxruntime(audio, state, context)
    assert max(_max_errors(outputs, reference)) <= TOLERANCE


def test_state_and_context_carry_a_stream_across_tasks(model: ExportedModel) -> None:
    from client.models import run_local

    audio, state, context = model.example_inputs
    first = silero_vad.export_silero_vad(batch=4, chunks=16)
    head = run_local(first.envelope(audio[:, : 16 * 512], state, context))
    tail = run_local(first.envelope(audio[:, 16 * 512 :], head[1], head[2]))
    whole = run_local(model.example_envelope())

    np.testing.assert_allclose(np.concatenate([head[0], tail[0]], axis=1), whole[0], atol=1e-6)
    np.testing.assert_allclose(tail[1], whole[1], atol=1e-5)


@pytest.mark.skipif(not tpu_compiler_available(), reason="libtpu not installed")
def test_compiles_ahead_of_time_for_tpu_v5e_with_memory_figures(
    sandbox: Sandbox, model: ExportedModel
) -> None:
    result = sandbox.compile(model.compile_envelope(), "v5e:1x1")

    assert isinstance(result, CompileResult), result
    assert (result.platform, result.device_kind) == ("tpu", "TPU v5 lite")
    assert result.memory is not None and result.cost is not None
    assert result.memory.argument_bytes >= 1_200_000  # the weights (about 1.2 MB) at least
    assert 0 < result.memory.total_bytes < GIB
    assert result.cost.flops > 0
    assert result.available_bytes is not None and result.available_bytes > 15 * GIB
