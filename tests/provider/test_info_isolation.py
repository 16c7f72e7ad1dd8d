"""``/v1/info`` states the walls the live workers measured from inside, not what was meant."""

from __future__ import annotations

from fastapi.testclient import TestClient

from provider.daemon import Daemon
from provider.sandbox.isolation import WORKER_UID


def test_info_states_the_measured_walls(api: TestClient, daemon: Daemon) -> None:
    isolation = api.get("/v1/info").json()["isolation"]
    assert isolation["mode"] == "bwrap" and isolation["workers"] >= 1
    assert isolation["uid"] == isolation["host_uid"] == WORKER_UID  # not root, even as root
    assert isolation["capabilities"] == "none" and isolation["no_new_privs"] is True
    assert isolation["syscalls"] == "allowlist" and isolation["seccomp"] is True
    assert isolation["network"] == "none" and isolation["inherited_fds"] == 0
    assert isolation["shortfalls"] == []
    walls = [worker.walls for worker in daemon.sandbox.workers()]
    assert all(w["uid"] == WORKER_UID and w["seccomp"] == "allowlist" for w in walls)
