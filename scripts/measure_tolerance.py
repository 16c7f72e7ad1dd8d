"""Measure how far one program's outputs move between CPU configurations; print one JSON line.

The arbiter's default tolerance (``provider.arbiter.rules.Tolerance``) must hold the same
program re-run on another CPU, thread count or XLA flag set. This exports real models (the
demo's Silero VAD, an MLP, an attention block), runs each in fresh processes under several
configurations (threads, XLA optimisation level, fast math) and reports, per model and
configuration, the largest absolute and relative difference from the default run, and whether
the default tolerance holds it.

    .venv/bin/python scripts/measure_tolerance.py
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

CONFIGS: dict[str, dict[str, str]] = {
    "default": {},
    "one_thread": {
        "XLA_FLAGS": "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1",
        "TASKSET": "0",
    },
    "opt_level_0": {"XLA_FLAGS": "--xla_backend_optimization_level=0"},
    "fast_math": {"XLA_FLAGS": "--xla_cpu_enable_fast_math=true"},
}


def _export(folder: Path) -> list[str]:
    import jax
    import jax.numpy as jnp

    from client.models.jax_export import export_jax
    from client.models.zoo.silero_vad import export_silero_vad, initial_state, speech_like_audio
    from programs.envelope import encode_envelope

    rng = np.random.default_rng(0)
    names = []
    vad = export_silero_vad(batch=4, chunks=32)
    audio = speech_like_audio(4, 32, 1)
    state, context = initial_state(4)
    (folder / "silero_vad").write_bytes(encode_envelope(vad.envelope(audio, state, context)))
    names.append("silero_vad")

    def mlp(w: Any, x: Any) -> Any:
        return jax.nn.gelu(x @ w["w1"]) @ w["w2"]

    w1 = rng.standard_normal((256, 1024), dtype=np.float32) / 16
    w2 = rng.standard_normal((1024, 256), dtype=np.float32) / 32
    x = rng.standard_normal((64, 256), dtype=np.float32)
    m = export_jax(mlp, weights={"w1": w1, "w2": w2}, example_inputs=[x])
    (folder / "mlp").write_bytes(encode_envelope(m.envelope(x)))
    names.append("mlp")

    def attention(w: Any, x: Any) -> Any:
        q, k, v = x @ w["wq"], x @ w["wk"], x @ w["wv"]
        scores = jax.nn.softmax(q @ jnp.swapaxes(k, -1, -2) / 8.0, axis=-1)
        return jnp.tanh(scores @ v)

    ws = {n: rng.standard_normal((64, 64), dtype=np.float32) / 8 for n in ("wq", "wk", "wv")}
    xa = rng.standard_normal((8, 128, 64), dtype=np.float32)
    a = export_jax(attention, weights=ws, example_inputs=[xa])
    (folder / "attention").write_bytes(encode_envelope(a.envelope(xa)))
    names.append("attention")
    return names


def _run(folder: Path, names: list[str], out: Path) -> None:
    """In a fresh process: run each envelope with JAX on the CPU; save the outputs."""
    from client.models.jax_export import run_local
    from programs.envelope import decode_envelope

    results: dict[str, np.ndarray[Any, Any]] = {}
    for name in names:
        outputs = run_local(decode_envelope((folder / name).read_bytes()))
        for i, leaf in enumerate(outputs):
            results[f"{name}.{i}"] = np.asarray(leaf)
    np.savez(out, **results)  # type: ignore[arg-type]


def main() -> None:
    """Export, run under each configuration, compare with the default run."""
    from provider.arbiter.rules import Tolerance

    tolerance = Tolerance()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        names = _export(folder)
        runs: dict[str, dict[str, np.ndarray[Any, Any]]] = {}
        for config, env in CONFIGS.items():
            out = folder / f"{config}.npz"
            command = [sys.executable, __file__, "--run", str(folder), ",".join(names), str(out)]
            if "TASKSET" in env:
                command = ["taskset", "-c", env["TASKSET"], *command]
            extra = {k: v for k, v in env.items() if k != "TASKSET"}
            subprocess.run(command, check=True, env={**os.environ, "JAX_PLATFORMS": "cpu", **extra})
            with np.load(out) as data:
                runs[config] = {k: data[k] for k in data.files}
    figures: dict[str, Any] = {}
    holds = True
    for config, outputs in runs.items():
        if config == "default":
            continue
        for key, got in outputs.items():
            want = runs["default"][key]
            diff = np.abs(got.astype(np.float64) - want.astype(np.float64))
            rel = diff / np.maximum(np.abs(want.astype(np.float64)), 1e-30)
            within = tolerance.compare({"0": got}, {"0": want}) is None
            holds &= within
            figures[f"{config}/{key}"] = {
                "dtype": str(want.dtype),
                "max_abs": float(diff.max()) if diff.size else 0.0,
                "max_rel_where_abs_gt_1e-6": float(rel[diff > 1e-6].max())
                if (diff > 1e-6).any()
                else 0.0,
                "within_default_tolerance": within,
            }
    print(json.dumps({"configs": list(CONFIGS), "tolerance_holds": holds, "outputs": figures}))


if __name__ == "__main__":
    if len(sys.argv) == 5 and sys.argv[1] == "--run":
        _run(Path(sys.argv[2]), sys.argv[3].split(","), Path(sys.argv[4]))
    else:
        main()
