"""Suite-wide rules: a skipped test fails the run, and `make check`'s fast selection.

`slow` marks every test that starts a real component (anvil, sandboxed workers, servers,
browsers, the PyTorch export environment) or runs a long property machine; `make check` runs
the rest (`-m "not slow"`), the pure cores, in a few minutes.

Every real component (anvil, bubblewrap, Chromium, PostgreSQL, libtpu, the models) is installed
by the set-up, so a skip means a missing install step, not a choice: the run fails and lists
it. Skips that depend on the kind of host (a TPU VM has chips where a test needs their absence)
give a reason starting with ``host:`` and are allowed; `TPUMARKET_ALLOW_SKIPS=1` allows the rest
on a developer's machine that lacks a component.

No process the run starts outlives it (see tests/processes.py): `pytest_configure` gives the run
its id and watchdog, and the session's end stops whatever is still running, naming it.
"""

from __future__ import annotations

import os
from collections.abc import Generator

import pytest

from tests import processes

HOST_SKIP = "host:"
SLOW_DIRS = ("e2e", "integration")
SLOW_FIXTURES = frozenset(
    {"anvil", "deployed", "world", "exact_clock", "chain_world", "sandbox", "daemon", "api"}
)
SLOW_MODULES = frozenset(
    {
        "test_no_orphans",
        "test_engine_properties",
        "test_escrow_stateful",
        "test_artifacts",
        "test_gas_snapshot",
        "test_web",
        "test_openapi",
        "test_native",
        "test_hostile_http",
        "test_routes_as_stranger",
        "test_journal_sealing",
        "test_cli_errors",
        "test_diagnosis_cases",
    }
)
SLOW_MODULE_PREFIXES = ("test_sandbox_",)
SLOW_TESTS = frozenset(
    {
        "test_typed_exceptions_match_the_compiled_abi",  # compiles the contracts with solc
        "test_discover_on_a_cpu_host_with_libtpu_then_no_libtpu_error_lines",
    }
)


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
    """Give the run an id its processes inherit and a watchdog that stops them if it dies."""
    processes.install()
    config.pluginmanager.register(_Reaper(), "tpumarket-reaper")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark as slow what starts real components or runs long machines."""
    for item in items:
        parts = item.path.parts
        fixtures = set(getattr(item, "fixturenames", ()))
        if (
            any(part in SLOW_DIRS for part in parts)
            or fixtures & SLOW_FIXTURES
            or item.path.stem in SLOW_MODULES
            or item.path.stem.startswith(SLOW_MODULE_PREFIXES)
            or getattr(item, "originalname", item.name) in SLOW_TESTS
            or "models" in parts
        ):
            item.add_marker(pytest.mark.slow)


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
