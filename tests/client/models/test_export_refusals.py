"""`job export` checks the program it would write by the rules every provider checks it by.

A program that no provider runs (a QR decomposition exported for CUDA as well as the CPU holds
a GPU solver kernel, a custom call no provider accepts) is not written: the export exits 2 with
the category, the op, the reason and the hints a provider's worker answers the same bytes with.
A program some platforms refuse (float64 on a TPU) is written with a note; a normal model is
written as before.
"""

from __future__ import annotations

import json
import textwrap
import threading
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import export

from client.cli import build_parser
from client.models import export_torch
from programs.envelope import ProducerVersions, ProgramEnvelope, decode_envelope
from programs.hints import F64_ON_TPU_HINTS, OP_COUNT_HINTS
from programs.refusals import HINTS, Category, RejectedProgram
from programs.rules import (
    DEFAULT_MAX_NESTING,
    DEFAULT_MAX_OPS,
    installed_ranges,
    ranges_to_wire,
)
from programs.validation import check_program
from provider.sandbox import Sandbox, TaskFailure
from tests.provider.daemon_support import served_daemon, start_world
from tests.provider.helpers import outputs, ran
from tests.provider.programs import spec

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning")
X = np.random.default_rng(3).standard_normal((4, 4)).astype(np.float32)
MODELS = textwrap.dedent(
    """
    import torch
    from torch import nn


    class Orthonormal(nn.Module):
        def forward(self, x):
            return torch.linalg.qr(x)[0]


    def qr():
        return Orthonormal()
    """
)


def _export_cli(
    tmp_path: Path, platforms: str, *, json_out: bool, extra: tuple[str, ...] = ()
) -> tuple[int, Path]:
    """Run `job export --from torchax` on the QR module for ``platforms``."""
    source = tmp_path / "models.py"
    source.write_text(MODELS)
    out = tmp_path / f"qr-{platforms.replace(',', '-')}.tpmp"
    argv = ["job", "export", "--from", "torchax", f"{source}:qr", "--example-inputs"]
    argv += ["float32[4,4]", "--platforms", platforms, "--out", str(out)]
    args = build_parser().parse_args(argv + (["--json"] if json_out else []) + list(extra))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return args.handler(args), out


def _qr_module() -> Any:
    namespace: dict[str, Any] = {}
    exec(compile(MODELS, "models.py", "exec"), namespace)  # the same module the CLI loads
    return namespace["qr"]()


def test_a_program_no_provider_runs_is_not_written_and_says_the_providers_words(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], sandbox: Sandbox
) -> None:
    code, out = _export_cli(tmp_path, "cpu,cuda", json_out=True)
    said = json.loads(capsys.readouterr().out.strip().splitlines()[-1])

    assert code == 2
    assert not out.exists() and not out.with_suffix(".inputs.safetensors").exists()
    assert said["error"] == "refused_by_providers"
    assert said["category"] == "unsupported_op"
    assert said["op"].startswith("cusolver_"), said
    assert f"disallowed custom call target '{said['op']}'" in said["message"]
    assert said["hints"] == list(HINTS[Category.UNSUPPORTED_OP])

    # The same program, sent to a provider's worker anyway: refused with the same words.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = export_torch(_qr_module(), [X], platforms=("cpu", "cuda"))
    with pytest.raises(RejectedProgram) as refused:
        check_program(model.example_envelope(), installed_ranges())
    failure = sandbox.run(model.example_envelope())
    assert isinstance(failure, TaskFailure), failure
    diagnosis = failure.diagnosis
    assert diagnosis.category is Category.UNSUPPORTED_OP
    assert (diagnosis.op, diagnosis.message) == (refused.value.op, str(refused.value))
    assert (diagnosis.op, diagnosis.message) == (said["op"], said["message"])
    assert list(diagnosis.hints) == said["hints"]


def test_the_refusal_in_words_names_category_op_hints_and_that_nothing_was_written(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out = _export_cli(tmp_path, "cpu,cuda", json_out=False)
    err = capsys.readouterr().err

    assert code == 2 and not out.exists()
    assert "error: no provider runs this program: unsupported_op (op cusolver_" in err
    for hint in HINTS[Category.UNSUPPORTED_OP]:
        assert f"hint: {hint}" in err
    assert f"nothing written to {out}" in err


def test_a_normal_model_is_written_as_before_and_runs_on_a_provider(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], sandbox: Sandbox
) -> None:
    code, out = _export_cli(tmp_path, "cpu,tpu", json_out=True)
    said = json.loads(capsys.readouterr().out.strip().splitlines()[-1])

    assert code == 0, said
    assert said["refused_on"] == {} and said["op_count"] > 0
    assert said["platforms"] == ["cpu", "tpu"]
    import torch

    envelope = decode_envelope(out.read_bytes())
    eager = _qr_module()(torch.as_tensor(envelope.arguments()["0"])).numpy()
    result = sandbox.run(envelope)
    np.testing.assert_allclose(outputs(ran(result))[0], eager, atol=1e-5)


# ---- the check itself, on JAX programs (no torch) ----------------------------------------


def _envelope(fn: Any, *specs: Any, platforms: tuple[str, ...]) -> ProgramEnvelope:
    exported = export.export(jax.jit(fn), platforms=platforms)(*specs)
    return ProgramEnvelope.create(
        program=bytes(exported.serialize()),
        inputs=b"",
        producer=ProducerVersions(
            jax=jax.__version__,
            jaxlib=jax.__version__,
            calling_convention=exported.calling_convention_version,
        ),
        platforms=platforms,
    )


def test_float64_is_a_note_for_tpu_beside_cpu_and_a_refusal_for_tpu_alone() -> None:
    with jax.enable_x64(True):
        f64 = spec(4, dtype=jnp.float64)
        both = _envelope(jnp.tanh, f64, platforms=("cpu", "tpu"))
        tpu = _envelope(jnp.tanh, f64, platforms=("tpu",))

    checked = check_program(both, installed_ranges())
    assert list(checked.refused_on) == ["tpu"]
    note = checked.refused_on["tpu"]
    assert (note.category, note.op, note.advice) == (
        Category.UNSUPPORTED_OP,
        "float64",
        F64_ON_TPU_HINTS,
    )
    with pytest.raises(RejectedProgram) as refused:
        check_program(tpu, installed_ranges())
    assert (refused.value.category, refused.value.advice) == (
        Category.UNSUPPORTED_OP,
        F64_ON_TPU_HINTS,
    )


def test_the_caps_and_ranges_are_a_providers() -> None:
    envelope = _envelope(lambda x: jnp.sin(x) * 2 + 1, spec(4), platforms=("cpu",))
    assert check_program(envelope, installed_ranges()).op_count > 0
    with pytest.raises(RejectedProgram) as over:
        check_program(envelope, installed_ranges(), max_ops=2)
    assert (over.value.category, over.value.advice) == (Category.UNSUPPORTED_OP, OP_COUNT_HINTS)

    older = installed_ranges()
    older = type(older)(
        jax=(0, 4, 0),
        calling_convention_min=older.calling_convention_min,
        calling_convention_max=older.calling_convention_max,
        stablehlo_min=older.stablehlo_min,
        stablehlo_max=older.stablehlo_max,
    )
    with pytest.raises(RejectedProgram) as old:
        check_program(envelope, older)
    assert old.value.category is Category.VERSION_MISMATCH
    assert "newer than the provider's jax 0.4.0" in str(old.value)


# ---- a named provider's rules ------------------------------------------------------------


@contextmanager
def _serving(info: dict[str, Any]) -> Iterator[str]:
    """Serve ``info`` as ``/v1/info`` over real HTTP (a provider stating other rules)."""

    class Info(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = json.dumps(info).encode()
            self.send_response(200 if self.path == "/v1/info" else 404)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Info)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def test_a_named_provider_is_asked_for_its_rules_and_the_program_checked_by_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    world = start_world()
    try:
        with served_daemon(world, tmp_path) as daemon:
            info = httpx.get(daemon.url + "/v1/info", timeout=30).json()
            assert info["programs"] == {
                "ranges": ranges_to_wire(installed_ranges()),
                "max_ops": DEFAULT_MAX_OPS,
                "max_nesting": DEFAULT_MAX_NESTING,
            }
            named = ("--provider-url", daemon.url)
            code, _ = _export_cli(tmp_path, "cpu,cuda", json_out=True, extra=named)
            refused = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
            code_ok, out = _export_cli(tmp_path, "cpu,tpu", json_out=True, extra=named)
            written = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    finally:
        world.anvil.stop()
    assert (code, refused["checked_by"], refused["category"]) == (2, daemon.url, "unsupported_op")
    assert (code_ok, written["checked_by"]) == (0, daemon.url) and out.exists()

    # A provider that states a lower op cap refuses the program the daemon above accepts.
    stricter = dict(info, programs=dict(info["programs"], max_ops=written["op_count"] - 1))
    (tmp_path / "strict").mkdir()
    with _serving(stricter) as url:
        named = ("--provider-url", url)
        code, out = _export_cli(tmp_path / "strict", "cpu,tpu", json_out=False, extra=named)
    err = capsys.readouterr().err
    assert code == 2 and not out.exists()
    assert f"error: the provider at {url} refuses this program: unsupported_op: op count" in err
    assert f"hint: {OP_COUNT_HINTS[0]}" in err
