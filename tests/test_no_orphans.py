"""No process a test run starts outlives it (tests/processes.py).

A small pytest session runs in a subprocess with the suite's own conftest and the real stack of
the end-to-end tests: anvil, the market and a provider daemon with its sandbox workers. It is
killed with SIGKILL while a test runs, or with SIGTERM (a CI timeout) while a fixture is still
setting up, or its fixture fails halfway through its set-up; then not one of the processes it
started is left: neither a process it recorded (by pid and start time, workers included) nor
one carrying the probe variable it was started with.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import pytest

from services.lifetime import dies_with_parent
from tests import processes
from tests.polling import poll_until, wait_until

ROOT = Path(__file__).resolve().parent.parent
PROBE = "NO_ORPHANS_PROBE"
READY = "NO_ORPHANS_READY"
AT = "NO_ORPHANS_AT"

SCENARIO = textwrap.dedent(
    """
    import json
    import os
    import signal
    from pathlib import Path

    import pytest

    from contracts.pricing import outcome_based
    from tests.e2e.stack import stack


    def descendants():
        children = {}
        for name in os.listdir("/proc"):
            if name.isdigit():
                try:
                    text = Path(f"/proc/{name}/stat").read_text()
                except OSError:
                    continue
                fields = text[text.rindex(")") + 2 :].split()
                children.setdefault(int(fields[1]), []).append((int(name), int(fields[19])))
        found, todo = [], [os.getpid()]
        while todo:
            for pid, start in children.get(todo.pop(), []):
                try:
                    command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\\0", b" ")
                except OSError:
                    continue
                found.append([pid, start, command.decode(errors="replace")])
                todo.append(pid)
        return found


    def ready_to_be_killed():
        Path(os.environ["NO_ORPHANS_READY"]).write_text(json.dumps(descendants()))
        while True:
            signal.pause()


    @pytest.fixture
    def running(tmp_path_factory):
        at = os.environ["NO_ORPHANS_AT"]
        with stack(tmp_path_factory.mktemp("work"), market=True) as st:
            if at == "setup-error":
                Path(os.environ["NO_ORPHANS_READY"]).write_text(json.dumps(descendants()))
                raise RuntimeError("the fixture fails halfway through its set-up")
            st.start_provider("p", outcome_based(compile_price=20_000, inference_price=4_000))
            if at == "setup":
                ready_to_be_killed()
            yield st


    def test_waits_to_be_killed(running):
        ready_to_be_killed()
    """
)


def _start_time(pid: int) -> int | None:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2 :].split()
    return None if fields[0] in "ZX" else int(fields[19])


def _described(pid: int) -> str:
    """Return what /proc says of ``pid`` (its state, parent, signals and command)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text().splitlines()
        command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError as gone:
        return f"pid {pid}: {gone}"
    wanted = ("State", "PPid", "SigPnd", "ShdPnd", "SigBlk", "SigCgt")
    return f"pid {pid} ({command}): " + "; ".join(
        line for line in status if line.split(":")[0] in wanted
    )


def _survivors(probe: str, recorded: list[list[int | str]]) -> list[str]:
    """Return the recorded processes still running, and those carrying the probe."""
    left = [
        f"pid {pid} ({command})"
        for pid, start, command in recorded
        if _start_time(int(pid)) == start
    ]
    left += [str(found) for found in processes.find(probe, variable=PROBE)]
    return left


def _scenario(
    tmp_path: Path, at: str
) -> tuple[subprocess.Popen[bytes], str, list[list[int | str]], Path]:
    """Start the scenario's pytest; wait until its processes run; return it, the probe, what
    it recorded and its log."""
    (tmp_path / "scenario").mkdir()
    (tmp_path / "scenario" / "test_scenario.py").write_text(SCENARIO)
    probe = uuid.uuid4().hex
    ready = tmp_path / "ready.json"
    log = tmp_path / "pytest.log"
    with log.open("wb") as out:
        process = processes.spawn(
            [
                *(sys.executable, "-m", "pytest", "-q", "-p", "tests.conftest"),
                *("-p", "no:cacheprovider", "--basetemp", str(tmp_path / "inner")),
                str(tmp_path / "scenario" / "test_scenario.py"),
            ],
            cwd=ROOT,
            env={**os.environ, PROBE: probe, READY: str(ready), AT: at, "JAX_PLATFORMS": "cpu"},
            stdout=out,
            stderr=subprocess.STDOUT,
        )

    def started() -> bool:
        if ready.exists() and ready.stat().st_size:
            return True
        if process.poll() is not None:
            raise AssertionError(f"the scenario ended early: {log.read_text()[-3000:]}")
        return False

    wait_until(started, 300, "the scenario's processes")
    recorded: list[list[int | str]] = json.loads(ready.read_text())
    return process, probe, recorded, log


def _commands(recorded: list[list[int | str]]) -> str:
    return "\n".join(str(command) for _, _, command in recorded)


@pytest.mark.parametrize(
    ("sig", "at"),
    [(signal.SIGKILL, "test"), (signal.SIGTERM, "setup")],
    ids=["sigkill-mid-test", "sigterm-mid-setup"],
)
def test_killed_run_when_chain_market_and_daemon_run_then_none_is_left(
    tmp_path: Path, sig: signal.Signals, at: str
) -> None:
    process, probe, recorded, log = _scenario(tmp_path, at)
    try:
        commands = _commands(recorded)
        for part in ("anvil", "market.cli", "provider.cli", "provider.sandbox.worker"):
            assert part in commands, commands  # the scenario started what it should
        os.kill(process.pid, sig)
        code = process.wait(120)
        # SIGTERM ends the run as an interrupt (exit 2) after its teardown; SIGKILL at once.
        assert code == (-signal.SIGKILL if sig is signal.SIGKILL else 2), log.read_text()[-3000:]
        wait_until(lambda: not _survivors(probe, recorded), 60, "no process of the run left")
    finally:
        processes.stop(process)
    assert not _survivors(probe, recorded)


def test_fixture_failing_halfway_through_set_up_then_none_is_left(tmp_path: Path) -> None:
    process, probe, recorded, log = _scenario(tmp_path, "setup-error")
    try:
        code = process.wait(120)
        assert code == 1 and "fails halfway through its set-up" in log.read_text()
        commands = _commands(recorded)
        assert "anvil" in commands and "market.cli" in commands, commands
        wait_until(lambda: not _survivors(probe, recorded), 60, "no process of the run left")
    finally:
        processes.stop(process)


def test_stop_when_the_group_ignores_sigterm_then_sigkill_ends_all_of_it(tmp_path: Path) -> None:
    pids = tmp_path / "pids"
    shell = processes.spawn(
        ["sh", "-c", f'trap "" TERM; sleep 1000 & echo $$ $! > {pids}; wait'],
    )
    wait_until(lambda: pids.exists() and bool(pids.read_text().strip()), 30, "the group")
    members = [int(pid) for pid in pids.read_text().split()]
    assert all(_start_time(pid) is not None for pid in members)
    code = processes.stop(shell, grace_s=0.5)
    assert code == -signal.SIGKILL
    wait_until(lambda: all(_start_time(pid) is None for pid in members), 30, "the group gone")


def test_spawned_child_when_its_parent_is_killed_then_dies_too(tmp_path: Path) -> None:
    pid_file = tmp_path / "child"
    parent = processes.spawn(
        [
            sys.executable,
            "-c",
            "import sys, pathlib, signal; from tests import processes; "
            "child = processes.spawn(['sleep', '1000']); "
            f"pathlib.Path({str(pid_file)!r}).write_text(str(child.pid)); "
            "signal.pause()",
        ],
        cwd=ROOT,
    )
    try:
        wait_until(lambda: pid_file.exists() and bool(pid_file.read_text()), 60, "the child")
        child = int(pid_file.read_text())
        start = _start_time(child)
        assert start is not None
        processes.kill(parent)  # SIGKILL: the parent runs no cleanup of any kind
        if not poll_until(lambda: _start_time(child) != start, 30):
            raise AssertionError(f"the child outlived its parent by 30 s: {_described(child)}")
    finally:
        processes.stop(parent)


def test_spawned_child_when_its_parent_dies_at_once_then_dies_too(tmp_path: Path) -> None:
    """The parent exits the moment its child is started, before the child can have armed its
    parent-death signal: the child finds itself adopted and kills itself."""
    pids = []
    for attempt in range(10):
        pid_file = tmp_path / f"child-{attempt}"
        parent = processes.spawn(
            [
                sys.executable,
                "-c",
                "import os, pathlib; from tests import processes; "
                "child = processes.spawn(['sleep', '1000']); "
                f"pathlib.Path({str(pid_file)!r}).write_text(str(child.pid)); "
                "os._exit(0)",
            ],
            cwd=ROOT,
        )
        assert parent.wait(60) == 0
        pids.append(int(pid_file.read_text()))
    wait_until(lambda: all(_start_time(pid) is None for pid in pids), 30, "every child's death")


def test_dies_with_parent_when_the_parent_is_not_the_expected_one_then_the_command_never_runs(
    tmp_path: Path,
) -> None:
    marker = tmp_path / "ran"
    command = dies_with_parent(["touch", str(marker)], parent=1)
    assert subprocess.run(command, timeout=30).returncode == -signal.SIGKILL
    assert not marker.exists()
    assert subprocess.run(dies_with_parent(["touch", str(marker)]), timeout=30).returncode == 0
    assert marker.exists()


def test_find_when_a_run_is_nested_then_both_runs_reach_its_processes(tmp_path: Path) -> None:
    nested = processes.spawn(
        ["sleep", "1000"], env={**os.environ, processes.RUN_ENV: "outer-run:inner-run"}
    )
    try:
        # `spawn` starts a wrapper that arms the parent-death signal, then becomes `sleep`;
        # while one program replaces another its environment reads empty: wait for `sleep`.
        wait_until(
            lambda: Path(f"/proc/{nested.pid}/cmdline").read_bytes().startswith(b"sleep\0"),
            30,
            "the nested process running sleep",
        )
        for run in ("outer-run", "inner-run"):
            assert nested.pid in [found.pid for found in processes.find(run)]
        assert nested.pid not in [found.pid for found in processes.find("inner")]
    finally:
        processes.stop(nested)
