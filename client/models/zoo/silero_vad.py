"""Silero VAD v6 (16 kHz), the trained voice-activity detector shipped in the ``silero-vad`` wheel.

The weights are read from the wheel's ``silero_vad/data/silero_vad.onnx`` (the 16 kHz branch of
its top-level ``If``) and the network is re-implemented in JAX:

1. prepend 64 samples of context to each 512-sample chunk (576), reflect-pad 64 on the right;
2. STFT as a strided conv with the model's own basis (258 filters of 256, hop 128), magnitude
   of the 129 bins;
3. four conv1d + ReLU layers (129->128 s1, 128->64 s2, 64->64 s2, 64->128 s1; kernel 3, pad 1);
4. one LSTM cell (hidden 128; torch gate order i, f, g, o) carried across chunks;
5. ReLU, 1x1 conv to one logit, sigmoid: the speech probability of the chunk.

:func:`vad_sequence` scans that step over a whole clip, so one inference task scores many
chunks. Matmuls and convolutions ask for ``Precision.HIGHEST`` so a TPU gives f32 results,
not bf16 passes. ``onnx`` is needed to read the weights; ``onnxruntime`` only for
:func:`reference_onnxruntime`. Neither is imported at module import, nor is the
``silero_vad`` package itself (it imports torch): only its data file is located.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import numpy as np

from client.errors import ConverterUnavailableError, ModelExportError
from client.models.jax_export import DEFAULT_PLATFORMS, export_jax
from client.models.program import ExportedModel
from client.models.signature import Array

if TYPE_CHECKING:
    import jax

SAMPLE_RATE: Final = 16000
CHUNK: Final = 512
CONTEXT: Final = 64
HIDDEN: Final = 128
ONNX_FILE: Final = "silero_vad.onnx"
_BRANCH_PREFIX: Final = "If_0_then_branch__Inline_0__"
WEIGHT_NAMES: Final = (
    "stft.forward_basis_buffer",
    "encoder.0.reparam_conv.weight",
    "encoder.0.reparam_conv.bias",
    "encoder.1.reparam_conv.weight",
    "encoder.1.reparam_conv.bias",
    "encoder.2.reparam_conv.weight",
    "encoder.2.reparam_conv.bias",
    "encoder.3.reparam_conv.weight",
    "encoder.3.reparam_conv.bias",
    "decoder.rnn.weight_ih",
    "decoder.rnn.weight_hh",
    "decoder.rnn.bias_ih",
    "decoder.rnn.bias_hh",
    "decoder.decoder.2.weight",
    "decoder.decoder.2.bias",
)
_ENCODER_STRIDES: Final = (1, 2, 2, 1)

Weights = Mapping[str, Any]


def onnx_path() -> Path:
    """Return the path of the 16 kHz ONNX model inside the installed ``silero-vad`` wheel."""
    spec = importlib.util.find_spec("silero_vad")
    if spec is None or not spec.submodule_search_locations:
        raise ConverterUnavailableError(
            "silero-vad is not installed: pip install --no-deps silero-vad==6.2.3"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / "data" / ONNX_FILE
    if not path.is_file():
        raise ConverterUnavailableError(f"silero-vad has no {ONNX_FILE} at {path}")
    return path


def load_weights(path: Path | None = None) -> dict[str, Array]:
    """Read the 16 kHz weights from the ONNX file (float32 arrays keyed by torch names)."""
    try:
        import onnx
        from onnx import numpy_helper
    except ImportError as exc:
        raise ConverterUnavailableError("onnx is not installed: pip install onnx==1.23.2") from exc
    model = onnx.load(str(path or onnx_path()))
    branch = None
    for node in model.graph.node:
        if node.op_type == "If":
            for attribute in node.attribute:
                if attribute.name == "then_branch":
                    branch = attribute.g
    if branch is None:
        raise ModelExportError("silero ONNX graph has no 16 kHz branch (If.then_branch)")
    constants = {
        node.output[0].removeprefix(_BRANCH_PREFIX): node.attribute[0].t
        for node in branch.node
        if node.op_type == "Constant" and node.attribute and node.attribute[0].name == "value"
    }
    missing = [name for name in WEIGHT_NAMES if name not in constants]
    if missing:
        raise ModelExportError(f"silero ONNX graph lacks weights {missing}")
    return {
        name: np.ascontiguousarray(numpy_helper.to_array(constants[name]), dtype=np.float32)
        for name in WEIGHT_NAMES
    }


def _conv1d(x: jax.Array, w: jax.Array, b: jax.Array | None, stride: int, pad: int) -> jax.Array:
    import jax

    y = jax.lax.conv_general_dilated(
        x,
        w,
        window_strides=(stride,),
        padding=[(pad, pad)],
        dimension_numbers=("NCH", "OIH", "NCH"),
        precision=jax.lax.Precision.HIGHEST,
    )
    return y if b is None else y + b[None, :, None]


def vad_step(
    p: Weights, x: jax.Array, h: jax.Array, c: jax.Array
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Score one chunk with context, ``x`` (B, 576); return (prob (B,), h, c)."""
    import jax
    import jax.numpy as jnp

    hi = jax.lax.Precision.HIGHEST
    x = jnp.pad(x, ((0, 0), (0, CONTEXT)), mode="reflect")
    spectrum = _conv1d(x[:, None, :], p["stft.forward_basis_buffer"], None, HIDDEN, 0)
    bins = spectrum.shape[1] // 2
    real, imag = spectrum[:, :bins], spectrum[:, bins:]
    y = jnp.sqrt(real**2 + imag**2)
    for layer, stride in enumerate(_ENCODER_STRIDES):
        weight = p[f"encoder.{layer}.reparam_conv.weight"]
        bias = p[f"encoder.{layer}.reparam_conv.bias"]
        y = jax.nn.relu(_conv1d(y, weight, bias, stride, 1))
    features = y[:, :, 0]  # four 128-hop frames reduce to one
    gates = (
        jnp.matmul(features, p["decoder.rnn.weight_ih"].T, precision=hi)
        + p["decoder.rnn.bias_ih"]
        + jnp.matmul(h, p["decoder.rnn.weight_hh"].T, precision=hi)
        + p["decoder.rnn.bias_hh"]
    )
    i, f, g, o = jnp.split(gates, 4, axis=-1)
    c = jax.nn.sigmoid(f) * c + jax.nn.sigmoid(i) * jnp.tanh(g)
    h = jax.nn.sigmoid(o) * jnp.tanh(c)
    logit = (
        jnp.matmul(jax.nn.relu(h), p["decoder.decoder.2.weight"][0, :, 0], precision=hi)
        + p["decoder.decoder.2.bias"][0]
    )
    return jax.nn.sigmoid(logit), h, c


def vad_sequence(
    p: Weights, audio: jax.Array, state: jax.Array, context: jax.Array
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Score a clip chunk by chunk, carrying the LSTM state and the 64-sample context.

    ``audio`` (B, N*512) float32 at 16 kHz, ``state`` (2, B, 128) (h, c), ``context`` (B, 64).
    Return (probabilities (B, N), new state, new context): pass the last two back in to
    continue a stream.
    """
    import jax
    import jax.numpy as jnp

    batch, length = audio.shape
    chunks = jnp.transpose(audio.reshape(batch, length // CHUNK, CHUNK), (1, 0, 2))

    def body(
        carry: tuple[jax.Array, jax.Array, jax.Array], chunk: jax.Array
    ) -> tuple[tuple[jax.Array, jax.Array, jax.Array], jax.Array]:
        h, c, ctx = carry
        prob, h, c = vad_step(p, jnp.concatenate([ctx, chunk], axis=1), h, c)
        return (h, c, chunk[:, -CONTEXT:]), prob

    (h, c, ctx), probs = jax.lax.scan(body, (state[0], state[1], context), chunks)
    return probs.T, jnp.stack([h, c]), ctx


def initial_state(batch: int) -> tuple[Array, Array]:
    """Return the zero LSTM state (2, B, 128) and zero context (B, 64) of a new stream."""
    return np.zeros((2, batch, HIDDEN), np.float32), np.zeros((batch, CONTEXT), np.float32)


def speech_like_audio(batch: int, chunks: int, seed: int = 0) -> Array:
    """Return deterministic 16 kHz clips (B, chunks*512) that look like speech to a VAD.

    Each clip alternates quiet stretches (room noise at about -50 dBFS) with syllables:
    a glottal pulse train at a drifting pitch (90-220 Hz, with jitter) exciting three formant
    resonances that glide between vowels, under a raised-cosine syllable envelope.
    """
    rng = np.random.default_rng(seed)
    n = chunks * CHUNK
    t = np.arange(n) / SAMPLE_RATE
    clips = np.empty((batch, n), np.float32)
    vowels = np.array([[730, 1090, 2440], [270, 2290, 3010], [300, 870, 2240], [530, 1840, 2480]])
    for b in range(batch):
        signal = rng.normal(0.0, 0.003, n)
        position = int(rng.integers(800, 4000))
        while position < n - 1600:
            length = int(rng.integers(2400, 5600))  # 150-350 ms syllable
            end = min(position + length, n)
            span = t[position:end] - t[position]
            pitch = rng.uniform(90, 220) * (1 + 0.15 * np.sin(2 * np.pi * rng.uniform(2, 5) * span))
            phase = np.cumsum(pitch * (1 + rng.normal(0, 0.01, span.size)) / SAMPLE_RATE)
            pulses = np.diff(np.floor(phase), prepend=0.0)
            start, stop = vowels[rng.integers(4)], vowels[rng.integers(4)]
            glide = np.clip(span / span[-1], 0, 1)[:, None]
            formants = start * (1 - glide) + stop * glide
            voiced = np.zeros(span.size)
            taps = np.arange(int(0.02 * SAMPLE_RATE)) / SAMPLE_RATE
            for k, bandwidth in enumerate((80.0, 100.0, 140.0)):
                f_mid = float(formants[span.size // 2, k])
                ring = np.exp(-np.pi * bandwidth * taps) * np.sin(2 * np.pi * f_mid * taps)
                voiced += np.convolve(pulses, ring, mode="full")[: span.size] / (k + 1)
            envelope = np.sin(np.pi * np.clip(span / span[-1], 0, 1)) ** 2
            voiced *= envelope * rng.uniform(0.2, 0.5) / (np.abs(voiced).max() + 1e-9)
            signal[position:end] += voiced
            position = end + int(rng.integers(1600, 8000))  # 100-500 ms pause
        clips[b] = np.clip(signal, -1, 1)
    return clips


def export_silero_vad(
    *,
    batch: int = 4,
    chunks: int = 32,
    symbolic_batch: bool = True,
    platforms: Sequence[str] = DEFAULT_PLATFORMS,
    seed: int = 0,
) -> ExportedModel:
    """Export :func:`vad_sequence` with the wheel's weights; examples are speech-like clips.

    Inputs: audio (B, chunks*512), state (2, B, 128), context (B, 64); the batch is symbolic
    unless ``symbolic_batch`` is false. Outputs: probabilities (B, chunks), state, context.
    """
    audio = speech_like_audio(batch, chunks, seed)
    state, context = initial_state(batch)
    return export_jax(
        vad_sequence,
        weights=load_weights(),
        example_inputs=[audio, state, context],
        batch_dim="batch" if symbolic_batch else None,
        batch_axes=(0, 1, 0) if symbolic_batch else None,
        input_labels=["audio", "state", "context"],
        platforms=platforms,
    )


def reference_onnxruntime(
    audio: Array, state: Array, context: Array, path: Path | None = None
) -> tuple[Array, Array, Array]:
    """Run the wheel's ONNX model chunk by chunk with onnxruntime, as silero's wrapper does."""
    try:
        import onnxruntime
    except ImportError as exc:
        raise ConverterUnavailableError(
            "onnxruntime is not installed: pip install onnxruntime==1.32.0"
        ) from exc
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    session = onnxruntime.InferenceSession(
        str(path or onnx_path()), options, providers=["CPUExecutionProvider"]
    )
    sr = np.array(SAMPLE_RATE, dtype=np.int64)
    probs = []
    for start in range(0, audio.shape[1], CHUNK):
        chunk = audio[:, start : start + CHUNK]
        x = np.concatenate([context, chunk], axis=1)
        out, state = session.run(None, {"input": x, "state": state, "sr": sr})
        probs.append(out[:, 0])
        context = chunk[:, -CONTEXT:]
    return np.stack(probs, axis=1), np.asarray(state), np.asarray(context)
