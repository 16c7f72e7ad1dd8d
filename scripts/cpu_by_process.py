#!/usr/bin/env python3
"""Run a command and print the CPU its processes used, by kind of process.

Usage: `.venv/bin/python scripts/cpu_by_process.py [--interval S] [--json F] -- COMMAND ...`,
for example the suite as `make unit` runs it:
`.venv/bin/python scripts/cpu_by_process.py -- .venv/bin/pytest -n 3 --dist loadfile
--no-loadscope-reorder`.

Every `--interval` seconds (default 0.25) it reads each process's user and system time from
`/proc/<pid>/stat`, for every process that was not there when the command started, and keeps
the last figure read of each (a process that lives less than an interval, or the CPU a process
spends after its last reading, is missed: the totals are a lower bound). Kinds are told apart
by the command line; `--json` writes each process (command line, CPU seconds, parent pid, pid)
for a closer look. The command's exit status is this script's.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

TICKS = os.sysconf("SC_CLK_TCK")

KINDS = (
    (r"provider\.sandbox\.worker", "sandbox worker or validator"),
    (r"^/usr/bin/bwrap|^unshare", "sandbox wrapper"),
    (r"exec\(eval\(sys\.s", "pytest worker (tests run in-process)"),
    (r"provider\.cli run|provider run", "provider daemon"),
    (r"arbiter", "arbiter"),
    (r"market(\.cli)? serve|market serve", "market server"),
    (r"client\.cli|tpumarket|client\.demo", "command line (client, provider, chain)"),
    (r"anvil", "anvil"),
    (r"solc", "solc"),
    (r"pytest", "pytest (main or a subprocess run)"),
    (r"postgres", "postgres"),
    (r"chrom", "chromium"),
)


def kind_of(command: str) -> str:
    """Return the kind of process a command line names."""
    for pattern, kind in KINDS:
        if re.search(pattern, command):
            return kind
    return "other"


def read_stat(pid: str) -> tuple[float, int, int] | None:
    """Return (CPU seconds, parent pid, start tick) of `pid`, or None if it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / TICKS, int(fields[1]), int(fields[19])


def command_line(pid: str) -> str:
    """Return the command line of `pid` (empty if it is gone)."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
    except (OSError, UnicodeDecodeError):
        return ""


def sample(command: Sequence[str], interval: float) -> tuple[int, dict[tuple[str, int], list[Any]]]:
    """Run `command`; return its exit status and each process seen: [command, cpu, ppid]."""
    before = {d for d in os.listdir("/proc") if d.isdigit()}
    me = str(os.getpid())
    seen: dict[tuple[str, int], list[Any]] = {}
    child = subprocess.Popen(command)
    while child.poll() is None:
        for pid in os.listdir("/proc"):
            if not pid.isdigit() or pid in before or pid == me:
                continue
            stat = read_stat(pid)
            if stat is None:
                continue
            cpu, parent, start = stat
            entry = seen.setdefault((pid, start), [command_line(pid), 0.0, parent])
            entry[1] = cpu
        time.sleep(interval)
    return child.returncode, seen


def main(argv: Sequence[str] | None = None) -> int:
    """Parse arguments, run the command and print its CPU by kind of process."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--interval", type=float, default=0.25, help="seconds between reads")
    parser.add_argument("--json", type=Path, help="write every process seen to this file")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND ...")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no command given")
    started = time.monotonic()
    status, seen = sample(command, args.interval)
    wall = time.monotonic() - started
    cpu: Counter[str] = Counter()
    count: Counter[str] = Counter()
    for line, seconds, _ in seen.values():
        kind = kind_of(line)
        cpu[kind] += seconds
        count[kind] += 1
    for kind, seconds in cpu.most_common():
        print(f"{seconds:9.1f} s CPU  {count[kind]:5d} processes  {kind}", file=sys.stderr)
    total = sum(cpu.values())
    print(f"{total:9.1f} s CPU in {wall:.1f} s of wall time", file=sys.stderr)
    if args.json:
        rows = [
            [line, seconds, parent, int(pid)] for (pid, _), (line, seconds, parent) in seen.items()
        ]
        args.json.write_text(json.dumps(rows))
    return status


if __name__ == "__main__":
    sys.exit(main())
