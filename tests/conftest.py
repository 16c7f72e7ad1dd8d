"""Suite-wide rules: a skipped test fails the run, and `make check`'s fast selection.

`slow` marks every test that starts a real component (anvil, the Solidity compiler, sandboxed
workers, a daemon, a server, a subprocess, PostgreSQL, a browser, the PyTorch compiler) or
runs a long property machine, found by what the test starts, never by its name: the code of
every fixture it uses (anvil's, the sandbox's...), its own and its module's top level are read,
with the suite's helpers they call, for the launchers of those components (`LAUNCHERS`).
`pytest --slow-reasons --collect-only -q` prints why each test is slow. `make check` runs the
rest (`-m "not slow"`), the pure cores, in a few minutes; in that run starting any process,
server or multiprocessing child raises an error naming the test
(`tests.processes.forbid_components`), so a launcher the scan misses fails the fast set
instead of slowing it; a test module that starts something at
import (a probe in a `skipif`), or imports torch then (seconds of CPU), is not even imported in
that run.

Every real component (anvil, bubblewrap, Chromium, PostgreSQL, libtpu, the models) is installed
by the set-up, so a skip means a missing install step, not a choice: the run fails and lists
it. Skips that depend on the kind of host (a TPU VM has chips where a test needs their absence)
give a reason starting with ``host:`` and are allowed; `TPUMARKET_ALLOW_SKIPS=1` allows the rest
on a developer's machine that lacks a component.

No process the run starts outlives it (see tests/processes.py): `pytest_configure` gives the run
its id and watchdog, and the session's end stops whatever is still running, naming it.
"""

from __future__ import annotations

import ast
import functools
import inspect
import os
import re
import types
from collections.abc import Generator, Iterator
from pathlib import Path
from typing import Any, cast

import pytest

from tests import processes
from tests.file_order import costliest_first, file_seconds

HOST_SKIP = "host:"
ROOT = Path(__file__).resolve().parent.parent
# What starts a real component, as the code that starts it reads: the project's launchers (anvil,
# sandbox workers, a daemon with its own workers, the Solidity compiler, the market's server) and
# the standard ways to start a process or a server.
LAUNCHERS = re.compile(
    r"\bAnvil\.start\b|\bSandbox\(|\bWorkerProcess\(|\bDaemon\(|\bcompile_contracts\(|\b_run_solc\("
    r"|\bsubprocess\.(?:run|Popen|call|check_call|check_output)\b|\bPopen\("
    r"|\bprocesses\.spawn\(|\bspawn\(|\buvicorn\.|HTTPServer\b|\bcreate_server\("
    r"|\.listen\(|\bmultiprocessing\.Process\b|\bsync_playwright\b|\bchromium\b"
    r"|\bisolation_mode\("  # the sandbox's probe of bubblewrap runs it once
    r"|\bexport_(?:torch_)?xla(?:_many)?\(|\btorch-xla\b"  # the torch_xla export worker (.venv-xla)
    # torch.export, the PyTorch compiler a model conversion runs (seconds of CPU per model)
    r"|\bexport_torch(?:ax)?\(|\bexport_silero_vad\(|\btorch\.export\.export\("
)
COMPILER_MODULES = frozenset({"torch", "torchax"})
"""The PyTorch compiler's packages: a test module that imports one at import (seconds of CPU
before any test runs) is slow as a whole, and left unimported in the fast set."""
COMPONENT_PARAMS = frozenset({"postgresql"})
"""Parameters that give a test a real component its fixture starts for them alone (the
`backend` fixture's PostgreSQL; its SQLite runs stay fast)."""
PARAMETRIZED_FIXTURES = frozenset({"backend"})
"""Fixtures that start a component only for the parameters in `COMPONENT_PARAMS`: their code
is not read, their parameters are."""
SCAN_DEPTH = 4
"""How deep the scan follows the test suite's own helpers a test or fixture calls."""
PLUGIN_COMPONENTS = frozenset({"browser", "page", "context", "playwright", "browser_type"})
"""Fixtures of plugins (not the suite's own code, which the scan reads) that start a browser."""
LONG_RUN_STEPS = 2_000
"""A property test of more examples (a state machine's examples times its steps) is slow."""


class _Reaper:
    """Stops what the tests left running, once every fixture is torn down, and names it."""

    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_sessionfinish(self, session: pytest.Session) -> Generator[None]:
        # A wrapper: this runs after every other implementation, fixture teardown included,
        # even when one of them raises (an interrupt in set-up breaks tmp_path's teardown).
        try:
            yield
        finally:
            left = processes.reap()
            reporter = session.config.pluginmanager.get_plugin("terminalreporter")
            if left and reporter is not None:
                reporter.ensure_newline()
                reporter.section("processes the tests left running (stopped now)")
                for process in left:
                    reporter.write_line(str(process))


def pytest_configure(config: pytest.Config) -> None:
    """Give the run an id its processes inherit and a watchdog that stops them if it dies; in
    a run of the fast set, make starting any component an error naming the test."""
    processes.install()
    config.pluginmanager.register(_Reaper(), "tpumarket-reaper")
    if _fast_set(config) and not _xdist_controller(config):
        processes.forbid_components()


def _xdist_controller(config: pytest.Config) -> bool:
    """Return whether this process hands the tests to worker processes (`pytest -n N`): it runs
    none itself, and starting its workers is not a component; each worker keeps the guard."""
    workers = (
        config.getoption("numprocesses", None) if config.pluginmanager.has_plugin("xdist") else None
    )
    return bool(workers) and not hasattr(config, "workerinput")


def _defined_in_tests(obj: object) -> bool:
    """Return whether `obj` is the suite's own code (a module of `tests`, a test module or a
    conftest), which the scan reads; the project's and libraries' code it does not."""
    module = str(getattr(obj, "__module__", "") or "")
    return module.startswith("tests") or module.rpartition(".")[2].startswith(("test", "conftest"))


@functools.cache
def _source(obj: Any) -> str:
    try:
        return inspect.getsource(obj)
    except (OSError, TypeError):
        return ""


def _names(code: types.CodeType) -> Iterator[str]:
    yield from code.co_names
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from _names(const)


@functools.cache
def _starts(obj: Any, depth: int = SCAN_DEPTH) -> str | None:
    """Return what `obj` (a function or class of the suite) starts, by its code and that of
    the suite's helpers it calls, or None."""
    found = LAUNCHERS.search(_source(obj))
    if found is not None:
        return found.group(0)
    if depth == 0:
        return None
    functions = [obj]
    if isinstance(obj, type):
        functions = [v for v in vars(obj).values() if inspect.isfunction(v)]
    for function in functions:
        function = inspect.unwrap(function)
        code = getattr(function, "__code__", None)
        namespace = getattr(function, "__globals__", {})
        if code is None:
            continue
        for name in set(_names(code)):
            helper = namespace.get(name)
            if helper is None or helper is obj or not _defined_in_tests(helper):
                continue
            if inspect.isfunction(helper) or inspect.isclass(helper):
                what = _starts(cast(Any, helper), depth - 1)
                if what is not None:
                    return f"{what} (in {helper.__name__})"
    return None


@functools.cache
def _module_starts(path: Path) -> str | None:
    """Return what a test module starts at import (its top-level statements), or None."""
    try:
        tree = ast.parse(path.read_text())
    except (OSError, SyntaxError):
        return None
    for node in _import_time(tree.body):
        for call in ast.walk(node):  # what it calls, not the text it holds
            if isinstance(call, ast.Call):
                found = LAUNCHERS.search(ast.unparse(call.func) + "(")
                if found is not None:
                    return found.group(0)
    return None


@functools.cache
def _module_imports(path: Path, depth: int = 1) -> str | None:
    """Return the compiler package (`COMPILER_MODULES`) a module imports at import, directly or
    through a suite module it imports then (`depth` levels), or None."""
    try:
        tree = ast.parse(path.read_text())
    except (OSError, SyntaxError):
        return None
    nodes: list[ast.AST] = [s for s in tree.body if isinstance(s, ast.Import | ast.ImportFrom)]
    nodes += [n for node in _import_time(tree.body) for n in ast.walk(node)]
    for node in nodes:
        if isinstance(node, ast.Import):
            modules = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = _absolute(path, node)
            modules = [base] + [f"{base}.{alias.name}" for alias in node.names]
        else:
            continue
        for module in modules:
            if module.partition(".")[0] in COMPILER_MODULES:
                return module.partition(".")[0]
            helper = _suite_file(module) if depth > 0 else None
            found = _module_imports(helper, depth - 1) if helper is not None else None
            if found is not None:
                return f"{found} (through {module})"
    return None


def _absolute(path: Path, node: ast.ImportFrom) -> str:
    """Return the module an `from ... import` names, a relative one resolved from `path`."""
    if not node.level:
        return node.module or ""
    package = path.parent
    for _ in range(node.level - 1):
        package = package.parent
    if not package.is_relative_to(ROOT):
        return ""
    parts = package.relative_to(ROOT).parts
    return ".".join([*parts, *([node.module] if node.module else [])])


def _suite_file(module: str) -> Path | None:
    """Return the file of a module of the suite (`tests.*`), or None."""
    if not module.startswith("tests."):
        return None
    path = ROOT.joinpath(*module.split("."))
    for candidate in (path.with_suffix(".py"), path / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _import_time(body: list[ast.stmt]) -> Iterator[ast.AST]:
    """Yield what a module runs when imported: its statements, the decorators and defaults of
    its functions and classes, a class's own statements; not the bodies of functions."""
    for statement in body:
        if isinstance(statement, ast.FunctionDef | ast.AsyncFunctionDef):
            yield from statement.decorator_list
            yield from statement.args.defaults
        elif isinstance(statement, ast.ClassDef):
            yield from statement.decorator_list
            yield from _import_time(statement.body)
        elif not isinstance(statement, ast.Import | ast.ImportFrom):
            yield statement


def _long_run(item: pytest.Item) -> int:
    """Return the steps of a property test: examples, times steps for a state machine."""
    cls = getattr(item, "cls", None)
    chosen = getattr(cls, "settings", None) if cls is not None else None
    if chosen is None:
        chosen = getattr(getattr(item, "obj", None), "_hypothesis_internal_use_settings", None)
    if chosen is None:
        return 0
    steps = getattr(chosen, "stateful_step_count", 1) if cls is not None else 1
    return int(getattr(chosen, "max_examples", 0)) * int(steps)


def slow_reason(item: pytest.Item) -> str | None:
    """Return why `item` is slow (the component it starts, and through what), or None."""
    info = getattr(item, "_fixtureinfo", None)
    for name, definitions in (info.name2fixturedefs if info is not None else {}).items():
        if name in PLUGIN_COMPONENTS:
            return f"fixture {name} (a browser)"
        for definition in definitions:
            function = definition.func
            if name not in PARAMETRIZED_FIXTURES and _defined_in_tests(function):
                what = _starts(function)
                if what is not None:
                    return f"fixture {name} starts {what}"
    callspec = getattr(item, "callspec", None)
    if callspec is not None:
        params = callspec.params.values()
        started = sorted(v for v in params if isinstance(v, str) and v in COMPONENT_PARAMS)
        if started:
            return f"parameter {started[0]}"
    test = getattr(item, "obj", None)
    if test is not None:
        what = _starts(inspect.unwrap(test))
        if what is not None:
            return f"the test starts {what}"
    cls = getattr(item, "cls", None)
    if cls is not None and _defined_in_tests(cls):
        what = _starts(cls)
        if what is not None:
            return f"its class starts {what}"
    what = _module_starts(item.path)
    if what is not None:
        return f"its module starts {what} at import"
    what = _module_imports(item.path)
    if what is not None:
        return f"its module imports {what} at import"
    if _long_run(item) >= LONG_RUN_STEPS:
        return f"a property run of {_long_run(item)} steps"
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark slow every test that starts a real component: by the fixtures it uses, its own code
    and its module's, each read with the suite's helpers they call; and long property runs.
    Then order the files costliest first (`tests.file_order`)."""
    for item in items:
        reason = slow_reason(item)
        if reason is not None:
            item.add_marker(pytest.mark.slow(reason=reason))
    items[:] = costliest_first(items, file_seconds())  # the longest files start first
    if config.getoption("--slow-reasons"):
        for item in items:
            marker = item.get_closest_marker("slow")
            print(f"{item.nodeid}: {marker.kwargs.get('reason') if marker else 'fast'}")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--slow-reasons",
        action="store_true",
        help="print why each collected test is slow (what it starts) or fast",
    )


def _fast_set(config: pytest.Config) -> bool:
    """Return whether this run is the fast set (`-m "not slow"`)."""
    return "not slow" in (config.getoption("markexpr", "") or "")


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """In the fast set, leave unimported a test module that starts a component or imports the
    PyTorch compiler at import."""
    module = collection_path.suffix == ".py" and collection_path.name.startswith("test_")
    at_import = _module_starts, _module_imports
    if module and _fast_set(config) and any(found(collection_path) for found in at_import):
        return True
    return None


def pytest_collectstart(collector: pytest.Collector) -> None:
    processes.set_current(f"collecting {collector.nodeid or 'the suite'}")


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    processes.set_current(item.nodeid)


def _reason(report: pytest.TestReport) -> str:
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        return str(longrepr[2]).removeprefix("Skipped: ")
    return str(longrepr)


def _unexpected_skips(session: pytest.Session) -> list[pytest.TestReport]:
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is None:
        return []
    skipped = [r for r in reporter.stats.get("skipped", []) if isinstance(r, pytest.TestReport)]
    return [r for r in skipped if not _reason(r).startswith(HOST_SKIP)]


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Fail a green run that skipped a test the set-up should have made runnable."""
    if os.environ.get("TPUMARKET_ALLOW_SKIPS") == "1" or exitstatus != pytest.ExitCode.OK:
        return
    if _unexpected_skips(session):
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Name each skip that fails the run, with its reason."""
    if os.environ.get("TPUMARKET_ALLOW_SKIPS") == "1":
        return
    skips = [
        r
        for r in terminalreporter.stats.get("skipped", [])
        if isinstance(r, pytest.TestReport) and not _reason(r).startswith(HOST_SKIP)
    ]
    if skips:
        terminalreporter.section("skipped tests fail the run (a missing install step?)")
        for report in skips:
            terminalreporter.write_line(f"{report.nodeid}: {_reason(report)}")
