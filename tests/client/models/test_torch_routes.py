"""Real PyTorch modules by both routes, run by a real provider daemon through its task API.

torchax converts here (torch 2.13); torch_xla exports in ``.venv-xla`` (torch 2.9 +
torch-xla 2.9, one worker process for every module of this file). Each program runs as an
inference task on the daemon (CPU) and must equal torch eager within ``TOLERANCE``, and
compiles for TPU v5e through the daemon's compile task. Modules that cannot be exported come
back diagnosed: category, op, the first real error line, hints.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from client.cli import build_parser
from client.models import ExportedModel, export_torch, run_local
from client.models.export_diagnosis import ExportCategory, ExportFailed
from contracts.messages import KIND_COMPILE
from programs.envelope import decode_envelope, encode_arrays
from tests.client.models import torch_zoo
from tests.client.models.torch_support import (
    FAILURES,
    MISSING_FACTORY,
    NAMES,
    ROUTES,
    TOLERANCE,
    TRAINED,
    Case,
    Node,
    example,
    export_torchax,
    export_xla,
    make_cases,
    max_error,
    run_task,
    start_node,
)

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning")


@pytest.fixture(scope="module")
def cases() -> dict[str, Case]:
    """The three modules with their inputs and torch eager's outputs."""
    return make_cases()


@pytest.fixture(scope="module")
def xla_results(cases: dict[str, Case]) -> dict[str, ExportedModel | ExportFailed]:
    """Every module of this file exported by torch_xla in one start of .venv-xla."""
    return export_xla(cases)


@pytest.fixture(scope="module")
def programs(
    cases: dict[str, Case], xla_results: dict[str, ExportedModel | ExportFailed]
) -> dict[tuple[str, str], ExportedModel]:
    """Each module by each route, exported once."""
    out: dict[tuple[str, str], ExportedModel] = {}
    for name, case in cases.items():
        out[name, "torchax"] = export_torchax(case)
        xla = xla_results[name]
        assert isinstance(xla, ExportedModel), xla
        out[name, "torch_xla"] = xla
    return out


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Node]:
    """One provider daemon (real chain, real sandbox worker) shared by every module here."""
    with start_node(tmp_path_factory.mktemp("torch-routes-provider")) as running:
        yield running


@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize("name", NAMES)
def test_module_exported_by_each_route_run_by_the_daemon_equals_torch_eager(
    node: Node,
    cases: dict[str, Case],
    programs: dict[tuple[str, str], ExportedModel],
    name: str,
    route: str,
) -> None:
    model, case = programs[name, route], cases[name]
    body = run_task(node, model.envelope(*case.inputs))

    assert body["state"] == "succeeded", body
    assert max_error(model.decode_outputs(base64.b64decode(body["outputs_b64"])), case) <= TOLERANCE


@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize("name", NAMES)
def test_module_exported_by_each_route_compiles_for_tpu_v5e_on_the_daemon(
    node: Node, programs: dict[tuple[str, str], ExportedModel], name: str, route: str
) -> None:
    model = programs[name, route]
    assert model.platforms == ("cpu", "tpu")

    body = run_task(node, model.compile_envelope(), KIND_COMPILE, "v5e:1x1")

    assert body["state"] == "succeeded", body
    assert body["report"]["device_kind"] == "TPU v5 lite"
    assert body["report"]["memory_total_bytes"] > 0


def test_trained_silero_vad_by_torch_xla_tells_speech_from_pauses(
    cases: dict[str, Case], programs: dict[tuple[str, str], ExportedModel]
) -> None:
    model = programs[TRAINED, "torch_xla"]
    probs, state, context = run_local(model.example_envelope())
    assert probs.shape == (2, 8) and state.shape == (2, 2, 128) and context.shape == (2, 64)
    assert (probs > 0.8).any() and (probs < 0.1).any()  # a syllable and a pause
    assert model.weights is not None and len(model.weights) > 1_200_000  # the trained weights


def test_weights_keep_their_state_dict_names_on_the_torch_xla_route(
    cases: dict[str, Case], programs: dict[tuple[str, str], ExportedModel]
) -> None:
    model = programs["conv", "torch_xla"]
    labels = {spec.label for spec in model.signature.weights}
    assert labels <= set(cases["conv"].module.state_dict())
    assert {"conv1.weight", "bn.running_mean", "head.bias"} <= labels
    assert [s.shape for s in model.signature.inputs] == [(2, 3, 16, 16)]


def _check_diagnosis(failure: object, route: str, name: str) -> None:
    assert isinstance(failure, ExportFailed), failure
    _, category, ops = FAILURES[name]
    diagnosis = failure.diagnosis
    assert (diagnosis.route, diagnosis.category) == (route, category), diagnosis
    assert diagnosis.op == ops.get(route), diagnosis
    assert diagnosis.message and "\n" not in diagnosis.message
    assert "Traceback" not in diagnosis.message and len(diagnosis.message) <= 500
    assert diagnosis.hints and category.value in str(failure)


@pytest.mark.parametrize("name", list(FAILURES))
def test_torch_xla_export_failure_is_diagnosed(
    xla_results: dict[str, ExportedModel | ExportFailed], name: str
) -> None:
    _check_diagnosis(xla_results[name], "torch_xla", name)


def test_torch_xla_factory_the_file_lacks_is_a_load_failure(
    xla_results: dict[str, ExportedModel | ExportFailed],
) -> None:
    failure = xla_results[MISSING_FACTORY]
    assert isinstance(failure, ExportFailed), failure
    assert (failure.diagnosis.category, failure.diagnosis.stage) == (
        ExportCategory.MODEL_LOAD,
        "load",
    )
    assert f"has no callable '{MISSING_FACTORY}'" in failure.diagnosis.message


@pytest.mark.parametrize("name", list(FAILURES))
def test_torchax_export_failure_is_diagnosed(name: str) -> None:
    shape = FAILURES[name][0]
    module = getattr(torch_zoo, f"make_{name}")()
    with pytest.raises(ExportFailed) as raised:
        export_torch(module, [example(shape, 0)])
    _check_diagnosis(raised.value, "torchax", name)


# ---- the command line ----------------------------------------------------------------------


def test_cli_exports_by_torch_xla_a_program_file_the_sdk_runs(
    cases: dict[str, Case], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    case = cases["mlp"]
    weights = tmp_path / "mlp.safetensors"
    weights.write_bytes(encode_arrays({k: v.numpy() for k, v in case.module.state_dict().items()}))
    inputs = tmp_path / "x.safetensors"
    inputs.write_bytes(encode_arrays({"0": case.inputs[0]}))
    program = tmp_path / "mlp.tpmp"

    argv = ["job", "export", "--from", "torch-xla", f"{torch_zoo.__file__}:make_mlp"]
    argv += ["--example-inputs", str(inputs), "--state-dict", str(weights)]
    args = build_parser().parse_args([*argv, "--out", str(program), "--json"])

    code = args.handler(args)

    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert code == 0, summary
    assert summary["platforms"] == ["cpu", "tpu"] and summary["route"] == "torch-xla"
    assert max_error(run_local(decode_envelope(program.read_bytes())), case) <= TOLERANCE
    assert Path(str(summary["inputs"])).is_file()


USER_MODEL = """
import torch


class Gate(torch.nn.Module):
    def forward(self, x):
        return x.relu() if x.mean() > 0 else x.tanh()


def make():
    return Gate()
"""


def test_cli_prints_the_diagnosis_of_a_module_torchax_cannot_export(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "gate.py").write_text(USER_MODEL)
    argv = ["job", "export", "--from", "torchax", f"{tmp_path / 'gate.py'}:make"]
    argv += ["--example-inputs", "float32[3,5]", "--out", str(tmp_path / "never.tpmp"), "--json"]
    args = build_parser().parse_args(argv)

    assert args.handler(args) == 1
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert (summary["category"], summary["stage"]) == ("data_dependent_control_flow", "export")
    assert summary["hints"] and not (tmp_path / "never.tpmp").exists()


def test_cli_refuses_a_model_outside_the_zoo_without_a_route(
    capsys: pytest.CaptureFixture[str],
) -> None:
    args = build_parser().parse_args(["job", "export", "resnet", "--out", "never.tpmp"])

    assert args.handler(args) == 2
    assert "--from torchax|torch-xla" in capsys.readouterr().err
    assert not Path("never.tpmp").exists()
