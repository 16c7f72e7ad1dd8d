"""The daemon's sandbox runs as many processes as its config says (the ``sandbox_*`` keys).

A daemon served by its CLI with no standby worker, one validator and no standby validator
(the defaults: one, two and one) has exactly one worker interpreter and one validator
interpreter among its descendants once it answers its health check: every key reached the
sandbox. Negative counts are refused by the config (``tests/provider/test_config_settings.py``).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import httpx

from provider.sandbox.sandbox import VALIDATOR_NICE
from provider.sandbox.worker_process import WORKER_MODULE
from tests.provider.daemon_support import ChainWorld, served_daemon


def sandbox_interpreters(root: int) -> list[int]:
    """Return the nice value each sandbox worker interpreter under ``root`` was told to take
    (its limits argument); bwrap, unshare and setpriv launchers are not counted, only
    ``python -m <worker>``."""
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            text = Path(f"/proc/{name}/stat").read_text()
        except OSError:
            continue
        children.setdefault(int(text[text.rindex(")") + 2 :].split()[1]), []).append(int(name))
    found, todo = [], list(children.get(root, []))
    while todo:
        pid = todo.pop()
        todo += children.get(pid, [])
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
        except OSError:
            continue
        if argv[1:3] == ["-m", WORKER_MODULE]:  # python -m module fd limits cache
            found.append(int(json.loads(argv[4])["nice"]))
    return found


def test_daemon_when_configured_without_standby_processes_then_starts_those_it_names_only(
    chain_world: ChainWorld, tmp_path: Path
) -> None:
    settings = "sandbox_spares = 0\nsandbox_validators = 1\nsandbox_validator_spares = 0\n"
    with served_daemon(chain_world, tmp_path, settings=settings) as daemon:
        niceness = sorted(sandbox_interpreters(daemon.process.pid))
        assert niceness == [0, VALIDATOR_NICE]  # one worker, one validator: no more
        info = httpx.get(daemon.url + "/v1/info", timeout=30).json()
        assert info["isolation"]["workers"] == 1
