"""Fair use of the daemon's API by client address, and what a browser may do with its answers.

The daemon runs from its CLI (real uvicorn, real sockets) with room for 64 connections, 16 per
client address, and a small request budget per address. One address holding many slow
connections cannot make a normal client's calls fail (its connections past its share are
answered 429 with ``Retry-After`` and closed); an address past its request budget gets 429 with
``Retry-After``; bound to loopback, the daemon answers only a ``Host`` naming loopback (DNS
rebinding); every answer carries the security headers the market sends.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator

import httpx
import pytest

from tests.provider.daemon_support import (
    ChainWorld,
    served_daemon,
)

PER_IP = 16
BURST = 40


@pytest.fixture(scope="module")
def served(chain_world: ChainWorld, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    settings = (
        "keep_alive_s = 60\n"  # the flood's connections stay while the test runs
        "request_read_timeout_s = 60\n"
        "[http]\n"
        "max_connections = 64\n"
        f"max_connections_per_ip = {PER_IP}\n"
        "rate_per_ip = 1\n"
        f"burst_per_ip = {BURST}\n"
    )
    work = tmp_path_factory.mktemp("daemon-fairness")
    with served_daemon(chain_world, work, settings=settings) as daemon:
        yield daemon.url


def _source(host: str) -> httpx.Client:
    return httpx.Client(timeout=30, transport=httpx.HTTPTransport(local_address=host))


def _answer(sock: socket.socket) -> bytes:
    """Return what the server sent before closing (b"" while it holds the connection)."""
    sock.settimeout(0.5)
    data = b""
    try:
        while chunk := sock.recv(4096):
            data += chunk
    except OSError:
        pass
    return data


def test_connection_flood_when_one_address_holds_slow_ones_then_a_normal_client_is_served(
    served: str,
) -> None:
    port = int(served.rsplit(":", 1)[1])
    flood = []
    for _ in range(100):  # more than the daemon may hold in all
        sock = socket.create_connection(
            ("127.0.0.1", port), timeout=10, source_address=("127.0.0.2", 0)
        )
        sock.sendall(b"GET /v1/health HTTP/1.1\r\nHost: 127.0.0.1\r\n")  # headers never end
        flood.append(sock)
    try:
        with _source("127.0.0.1") as normal:
            statuses = [normal.get(served + "/v1/health").status_code for _ in range(20)]
        refused = [a for a in (_answer(s) for s in flood[PER_IP:]) if a]
    finally:
        for sock in flood:
            sock.close()

    normal_refused_under_connection_flood = sum(status != 200 for status in statuses)
    assert normal_refused_under_connection_flood == 0, statuses
    assert len(refused) == 100 - PER_IP
    head, _, body = refused[0].partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 429") and b"retry-after: 1" in head.lower()
    assert b'"error":"too_many_connections"' in body


def test_requests_when_one_address_passes_its_budget_then_429_with_retry_after(
    served: str,
) -> None:
    with _source("127.0.0.4") as greedy, _source("127.0.0.5") as other:
        replies = [greedy.get(served + "/v1/health") for _ in range(2 * BURST)]
        bystander = other.get(served + "/v1/health")

    limited = [r for r in replies if r.status_code == 429]
    assert limited, [r.status_code for r in replies]
    assert limited[0].json()["error"] == "too_many_requests"
    assert int(limited[0].headers["retry-after"]) >= 1
    assert bystander.status_code == 200


def test_host_header_when_not_loopback_then_421_and_every_answer_carries_security_headers(
    served: str,
) -> None:
    port = served.rsplit(":", 1)[1]
    with _source("127.0.0.6") as http:
        rebound = http.get(served + "/v1/health", headers={"Host": f"evil.example:{port}"})
        answers = [
            http.get(served + "/v1/health", headers={"Host": f"localhost:{port}"}),
            http.get(served + "/v1/tasks/1/0"),  # 401
            http.post(served + "/v1/tasks", content=b"x"),  # the fast path's 400
            http.get(served + "/openapi.json"),
        ]

    assert rebound.status_code == 421 and rebound.json()["error"] == "host_not_allowed"
    assert [a.status_code for a in answers] == [200, 401, 400, 200]
    for answer in answers:
        assert answer.headers["x-content-type-options"] == "nosniff"
        assert "frame-ancestors 'none'" in answer.headers["content-security-policy"]
        assert answer.headers["x-frame-options"] == "DENY"
        assert answer.headers["referrer-policy"] == "no-referrer"
