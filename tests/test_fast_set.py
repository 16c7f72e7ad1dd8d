"""The fast set is chosen by what a test starts, and cannot hold a test that starts anything.

A fixture or a helper that starts a process marks every test that uses it slow by itself; a
test that starts one in a way the scan cannot read fails a `-m "not slow"` run with an error
that names it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

from tests import conftest, processes

ROOT = Path(__file__).resolve().parent.parent

SAMPLE = """
import subprocess
import sys

import pytest


def _hidden():  # a launch the scan cannot read: the guard stops it
    getattr(subprocess, "Po" + "pen")([sys.executable, "-c", "pass"]).wait()


def _helper():
    return subprocess.run([sys.executable, "-c", "pass"], check=True)


@pytest.fixture
def child():
    yield _helper()


def test_pure():
    assert 1 + 1 == 2


def test_uses_a_fixture_that_starts_a_process(child):
    assert child.returncode == 0


def test_calls_a_helper_that_starts_a_process():
    _helper()


def test_hides_a_process():
    _hidden()
"""


def _helper_that_compiles() -> None:
    from contracts.compiler import compile_contracts

    compile_contracts()


def _caller() -> None:
    _helper_that_compiles()


def _pure() -> int:
    return sum(range(3))


HELPERS = {"caller": _caller, "pure": _pure}  # looked up by key: this test starts neither


def test_scan_when_a_helper_of_a_helper_compiles_then_it_names_the_launcher() -> None:
    found = conftest._starts(HELPERS["caller"])
    assert found == "compile_contracts" + "( (in _helper_that_compiles)"
    assert conftest._starts(HELPERS["pure"]) is None


def test_fast_run_when_a_test_starts_a_process_then_it_is_deselected_or_fails_by_name(
    tmp_path: Path,
) -> None:
    (tmp_path / "test_sample.py").write_text(textwrap.dedent(SAMPLE))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TPUMARKET_ALLOW_SKIPS": "1"}
    env.pop(processes.RUN_ENV, None)  # hypothetical here: the inner run's processes are its own
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "tests.conftest", "-p", "no:cacheprovider",
         "-m", "not slow", "-q", "-rA", "--slow-reasons", str(tmp_path)],
        cwd=tmp_path, capture_output=True, text=True, timeout=300, env=env,
    )  # fmt: skip
    out = done.stdout + done.stderr
    assert "test_uses_a_fixture_that_starts_a_process: fixture child starts subprocess.run" in out
    assert "test_calls_a_helper_that_starts_a_process: the test starts subprocess.run" in out
    assert "test_pure: fast" in out
    assert "PASSED test_sample.py::test_pure" in out
    assert "FAILED test_sample.py::test_hides_a_process" in out
    assert "ComponentInFastRun: test_sample.py::test_hides_a_process started a subprocess" in out
    assert "2 deselected" in out, out


def test_module_that_imports_torch_at_import_is_slow_and_one_that_imports_it_late_is_not(
    tmp_path: Path,
) -> None:
    guarded = tmp_path / "test_guarded.py"
    guarded.write_text(
        "import importlib.util\nif importlib.util.find_spec('torch'):\n    import torch\n"
    )
    late = tmp_path / "test_late.py"
    late.write_text("def test_it():\n    import torch\n\n    assert torch\n")
    assert conftest._module_imports(guarded) == "torch"
    assert conftest._module_imports(late) is None
    # through a helper module of the suite it imports at its top
    routes = ROOT / "tests" / "client" / "models" / "test_torch_routes.py"
    assert conftest._module_imports(routes) == "torch (through tests.client.models.torch_zoo)"
    # the diagnosis tests import torch inside the tests that export, so the others stay fast
    assert conftest._module_imports(ROOT / "tests/client/models/test_export_hints.py") is None
