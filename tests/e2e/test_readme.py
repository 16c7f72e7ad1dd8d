"""The README's "Running parts on their own" runs as printed, in order, on a fresh chain.

The fenced block under that heading is the source. Each command (comments dropped, backslash
continuations joined, a heredoc kept whole) runs in bash, in order, in a fresh folder whose
``.venv`` is the project's. A command the README marks "keeps running" is started in the
background and awaited: ``chain up`` until it has printed its export lines, which every later
command gets, as the README tells the reader to paste them; ``market serve`` and ``provider
run`` until they answer over HTTP (the daemon also until its ask is on the market: the README's
next commands read it). Every other command must exit 0. The only change to the text: the
README's fixed ports (8000 for the market, 8700 for the daemon) become free ones, so the test
runs beside other processes. After the block, the chain and the market are checked: the bid
took the ask (same plan), the deal opened on chain for the client, the job's tasks were paid.

The Python block of docs/models.md ("Saving your own model as a program file") runs too, and
what it writes is accepted by `job run`'s input checks.
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from contracts.chain import free_port
from contracts.messages import address_of
from tests import processes
from tests.e2e.stack import ROOT, wait_until

README = ROOT / "README.md"
MODELS = ROOT / "docs" / "models.md"
KEEPS_RUNNING = "keeps running"


def fenced_block(text: str, heading: str, language: str) -> str:
    """Return the first ```language block after ``heading`` (a whole Markdown heading line)."""
    start = text.index(f"\n{heading}\n")
    match = re.compile(rf"\n```{language}\n(.*?)\n```\n", re.S).search(text, start)
    assert match is not None, f"no ```{language} block under {heading!r}"
    return match.group(1)


@dataclass
class Command:
    """One command of a shell block: its text (for bash) and whether it keeps running."""

    text: str
    keeps_running: bool


def _code_and_comment(line: str) -> tuple[str, str]:
    """Split a line at its first ``#`` outside quotes."""
    quote = ""
    for i, char in enumerate(line):
        if quote:
            quote = "" if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i].rstrip(), line[i + 1 :]
    return line.rstrip(), ""


def commands(block: str) -> list[Command]:
    """Split a shell block into commands: continuations joined, heredocs whole."""
    lines = block.splitlines()
    out: list[Command] = []
    i = 0
    while i < len(lines):
        code, comment = _code_and_comment(lines[i])
        i += 1
        if not code.strip():
            continue
        heredoc = re.search(r"<<-?'?(\w+)'?", code)
        if heredoc:
            body = []
            while lines[i] != heredoc.group(1):
                body.append(lines[i])
                i += 1
            i += 1
            out.append(Command("\n".join([code, *body, heredoc.group(1)]), False))
            continue
        parts, notes = [code], [comment]
        while parts[-1].endswith("\\"):
            parts[-1] = parts[-1][:-1].rstrip()
            code, comment = _code_and_comment(lines[i])
            i += 1
            parts.append(code.strip())
            notes.append(comment)
        while i < len(lines) and lines[i].lstrip().startswith("#") and lines[i][0].isspace():
            notes.append(lines[i])  # a comment continued on the next line, aligned
            i += 1
        out.append(Command(" ".join(parts), any(KEEPS_RUNNING in n for n in notes)))
    return out


@dataclass
class Service:
    """A command that keeps running, its output collected line by line."""

    command: Command
    popen: subprocess.Popen[str]
    lines: list[str] = field(default_factory=list)

    def read(self) -> None:
        """Collect the output until the process ends (a thread)."""
        assert self.popen.stdout is not None
        for line in self.popen.stdout:
            self.lines.append(line.rstrip("\n"))

    def printed(self, text: str) -> bool:
        """Return whether a line containing ``text`` was printed; fail if the process died."""
        if any(text in line for line in self.lines):
            return True
        if self.popen.poll() is not None:
            raise AssertionError(f"{self.command.text!r} exited: " + "\n".join(self.lines[-40:]))
        return False

    def alive(self) -> bool:
        """Return True while the process runs; fail with its output once it has exited."""
        if self.popen.poll() is not None:
            raise AssertionError(f"{self.command.text!r} exited: " + "\n".join(self.lines[-40:]))
        return True

    def stop(self) -> None:
        """SIGINT the process group (Ctrl-C), then SIGKILL what lingers."""
        if self.popen.poll() is None:
            os.killpg(self.popen.pid, signal.SIGINT)
            try:
                self.popen.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.popen.pid, signal.SIGKILL)
                self.popen.wait()


def _answers(url: str) -> bool:
    try:
        return httpx.get(url, timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


@pytest.fixture
def folder(tmp_path: Path) -> Iterator[Path]:
    """A fresh folder with the project's ``.venv``, and a home of its own."""
    (tmp_path / ".venv").symlink_to(ROOT / ".venv")
    (tmp_path / "home").mkdir()
    yield tmp_path


@pytest.mark.timeout(1_800)
def test_readme_running_parts_on_their_own_runs_as_printed(folder: Path) -> None:
    ports = {"8000": str(free_port()), "8700": str(free_port())}
    block = fenced_block(README.read_text(), "## Running parts on their own", "sh")
    for fixed, free in ports.items():
        block = block.replace(fixed, free)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TPUMARKET_", "MARKET_"))}
    env.update({"HOME": str(folder / "home"), "JAX_PLATFORMS": "cpu", "DATABASE_URL": ""})
    services: list[Service] = []
    ran: list[tuple[str, str]] = []
    try:
        for command in commands(block):
            if command.keeps_running:
                services.append(_start(command, folder, env))
                _ready(services[-1], env, ports)
                continue
            with (folder / "commands.log").open("a") as log:
                log.write(f"$ {command.text}\n")
            done = subprocess.run(
                ["bash", "-c", command.text],
                cwd=folder,
                env=env,
                capture_output=True,
                text=True,
                timeout=300,
            )
            with (folder / "commands.log").open("a") as log:
                log.write(f"{done.stdout}{done.stderr}exit {done.returncode}\n")
            assert done.returncode == 0, (
                f"{command.text!r} exited {done.returncode}:\n{done.stdout[-3000:]}"
                f"\n{done.stderr[-3000:]}"
            )
            ran.append((command.text, done.stdout))
    finally:
        for service in reversed(services):
            service.stop()
            name = "-".join(service.command.text.split()[1:3])
            (folder / f"{name}.log").write_text("\n".join(service.lines) + "\n")
        chain_lines = services[0].lines if services else []
    assert [s.command.text.split()[1:3] for s in services] == [
        ["chain", "up"],
        ["market", "serve"],
        ["provider", "run"],
    ]
    outputs = dict(ran)
    [bid_out] = [out for text, out in ran if " client bid " in text]
    assert "cpu:1" in bid_out and "(filled, 0 unmatched)" in bid_out
    [opened] = [out for text, out in ran if " client open " in text]
    assert "opened on chain as deal 1" in opened
    [job] = [out for text, out in ran if " job run " in text]
    assert re.search(r"^paid\s+2$", job, re.M), job  # the compile check and the inference
    assert any("agreed to close" in out or "closed" in out for out in outputs.values())
    assert any(line.strip().startswith("export TPUMARKET_RPC_URL=") for line in chain_lines)


def _start(command: Command, folder: Path, env: dict[str, str]) -> Service:
    popen = processes.spawn(
        ["bash", "-c", f"exec {command.text}"],
        cwd=folder,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    service = Service(command, popen)
    threading.Thread(target=service.read, daemon=True).start()
    return service


def _ready(service: Service, env: dict[str, str], ports: dict[str, str]) -> None:
    """Wait until a service the README starts is ready; apply `chain up`'s export lines."""
    words = shlex.split(service.command.text)
    what = " ".join(words[1:3])
    if what == "chain up":
        wait_until(lambda: service.printed("Ctrl-C stops the chain."), 120, "chain up")
        exports = [line.strip() for line in service.lines if line.strip().startswith("export ")]
        assert exports, service.lines
        for line in exports:
            for fixed, free in ports.items():
                line = line.replace(f":{fixed}", f":{free}")
            for pair in shlex.split(line)[1:]:
                key, _, value = pair.partition("=")
                env[key] = value
    elif what == "market serve":
        wait_until(lambda: service.printed("Ctrl-C stops it."), 120, "market serve")
        assert any(line.startswith("storage   SQLite ") for line in service.lines)
        wait_until(lambda: _answers(env["TPUMARKET_MARKET_URL"] + "/healthz"), 60, "market")
    elif what == "provider run":
        url = f"http://127.0.0.1:{ports['8700']}"
        wait_until(lambda: service.alive() and _answers(url + "/v1/health"), 300, "daemon")
        provider = address_of(env["TPUMARKET_PROVIDER_PRIVATE_KEY"]).lower()

        def ask_posted() -> bool:
            offers = httpx.get(env["TPUMARKET_MARKET_URL"] + "/v1/offers", timeout=5).json()
            return any(o["provider"].lower() == provider for o in offers)

        wait_until(ask_posted, 120, "the daemon's ask on the market")
    else:
        raise AssertionError(f"the test does not know how to await {service.command.text!r}")


def test_docs_models_saving_your_own_model_writes_a_program_file_job_run_accepts(
    folder: Path,
) -> None:
    from client.job_files import inference_tasks, read_envelope

    code = fenced_block(MODELS.read_text(), "## Saving your own model as a program file", "python")
    done = subprocess.run(
        [str(ROOT / ".venv" / "bin" / "python"), "-c", code],
        cwd=folder,
        env={**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    envelope = read_envelope(folder / "mlp.tpmp")
    [task] = inference_tasks(envelope, [folder / "mlp.inputs.safetensors"], 1)
    assert task.spec.envelope.weights == envelope.weights
