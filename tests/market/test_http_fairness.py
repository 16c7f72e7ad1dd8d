"""Fair use of the market by client address, on a real server process over real sockets.

One address holding many slow connections cannot make a normal client's calls fail: beyond its
share its connections are answered 429 with ``Retry-After`` and closed, while another address is
served. The client address is taken from ``X-Forwarded-For`` only when the peer is a configured
trusted proxy (tested both ways through the per-address rate limit, whose 429 names the
address). The ``Host`` header of a loopback-bound market must name loopback (DNS rebinding).
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.polling import wait_until

from .server import market_process

TOTAL = 64
PER_IP = 16
SLOW = ["--keep-alive", "60", "--request-read-timeout", "60"]  # the flood holds meanwhile


def _source(host: str) -> httpx.Client:
    return httpx.Client(timeout=30, transport=httpx.HTTPTransport(local_address=host))


@pytest.fixture(scope="module")
def small(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch_module: pytest.MonkeyPatch
) -> Iterator[str]:
    """A market with room for 64 connections, 16 per client address."""
    monkeypatch_module.setenv("TPUMARKET_MARKET_MAX_CONNECTIONS", str(TOTAL))
    monkeypatch_module.setenv("TPUMARKET_MARKET_MAX_CONNECTIONS_PER_IP", str(PER_IP))
    data = tmp_path_factory.mktemp("fair") / "data"
    with market_process(data, *SLOW) as (url, _):
        yield url


@pytest.fixture(scope="module")
def monkeypatch_module() -> Iterator[pytest.MonkeyPatch]:
    with pytest.MonkeyPatch.context() as patch:
        yield patch


def _hold(port: int, host: str, count: int) -> list[socket.socket]:
    """Open ``count`` connections from ``host``, each with a request that never completes."""
    held = []
    for _ in range(count):
        sock = socket.create_connection(("127.0.0.1", port), timeout=10, source_address=(host, 0))
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n")  # headers never end
        held.append(sock)
    return held


def _answer(sock: socket.socket) -> bytes:
    """Return what the server sent before closing (b"" if it holds the connection)."""
    sock.settimeout(0.5)
    data = b""
    try:
        while chunk := sock.recv(4096):
            data += chunk
    except TimeoutError:
        pass
    except OSError:
        pass
    return data


def test_connection_flood_when_one_address_holds_slow_ones_then_a_normal_client_is_served(
    small: str,
) -> None:
    port = int(small.rsplit(":", 1)[1])
    flood = _hold(port, "127.0.0.2", 100)  # more than the whole server may hold
    try:
        with _source("127.0.0.1") as normal:
            statuses = [normal.get(small + "/healthz").status_code for _ in range(20)]
            statuses += [normal.get(small + "/v1/overview").status_code for _ in range(5)]
        refused = [a for a in (_answer(s) for s in flood[PER_IP:]) if a]
    finally:
        for sock in flood:
            sock.close()

    normal_refused_under_connection_flood = sum(status != 200 for status in statuses)
    assert normal_refused_under_connection_flood == 0, statuses
    assert len(refused) == 100 - PER_IP  # every connection past the address's share
    head, _, body = refused[0].partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 429") and b"retry-after: 1" in head.lower()
    assert b"TooManyConnectionsError" in body and b"one client address" in body


@pytest.mark.parametrize("trusted", [False, True])
def test_client_address_when_forwarded_then_taken_only_from_a_trusted_proxy(
    tmp_path: Path, trusted: bool
) -> None:
    peer = "127.0.0.3" if trusted else "127.0.0.1"  # the server's framework trusted 127.0.0.1
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TPUMARKET_MARKET_RATE_PER_IP", "0.001")  # 2 requests per address, then 429
        patch.setenv("TPUMARKET_MARKET_BURST_PER_IP", "2")
        if trusted:
            patch.setenv("TPUMARKET_MARKET_TRUSTED_PROXIES", "127.0.0.3")
        with market_process(tmp_path / "data") as (url, _), _source(peer) as proxy:

            def via(client: str) -> httpx.Response:
                return proxy.get(url + "/v1/overview", headers={"X-Forwarded-For": client})

            first = [via("10.0.0.1"), via("10.0.0.1")]
            other = via("198.51.100.7")
            third = via("10.0.0.1")

    assert [r.status_code for r in first] == [200, 200]
    if trusted:  # each forwarded client has its own bucket
        assert other.status_code == 200
        assert third.status_code == 429 and "10.0.0.1" in third.json()["detail"]
    else:  # the header is anyone's to send: the peer is the client
        assert other.status_code == 429 and peer in other.json()["detail"]
        assert "198.51.100.7" not in other.text


def test_host_header_when_not_loopback_then_421(small: str) -> None:
    port = small.rsplit(":", 1)[1]
    with httpx.Client(timeout=30) as http:
        rebound = http.get(small + "/v1/overview", headers={"Host": f"evil.example:{port}"})
        local = http.get(small + "/v1/overview", headers={"Host": f"localhost:{port}"})

    assert rebound.status_code == 421 and rebound.json()["error"] == "HostNotAllowedError"
    assert local.status_code == 200


@pytest.fixture(scope="module")
def few_streams(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A market serving at most 8 live-update streams, 4 to one client address."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TPUMARKET_MARKET_MAX_STREAMS", "8")
        patch.setenv("TPUMARKET_MARKET_MAX_STREAMS_PER_IP", "4")
        data = tmp_path_factory.mktemp("streams") / "data"
        with market_process(data) as (url, _):
            yield url


def _open_at_once(url: str, sources: list[str]) -> list[tuple[socket.socket, bytes]]:
    """Send one stream request per source address, all before reading any answer; return each
    socket with its status line."""
    port = int(url.rsplit(":", 1)[1])
    socks = [
        socket.create_connection(("127.0.0.1", port), timeout=30, source_address=(host, 0))
        for host in sources
    ]
    request = b"GET /v1/stream HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
    for sock in socks:
        sock.sendall(request)
    answers = []
    for sock in socks:
        line = b""
        while not line.endswith(b"\r\n"):
            chunk = sock.recv(1)
            if not chunk:
                break
            line += chunk
        answers.append((sock, line))
    return answers


def _opened(answers: list[tuple[socket.socket, bytes]]) -> int:
    return sum(line.startswith(b"HTTP/1.1 200") for _, line in answers)


def test_streams_when_opened_concurrently_then_the_caps_hold_per_address_and_in_all(
    few_streams: str,
) -> None:
    one_address = _open_at_once(few_streams, ["127.0.0.11"] * 20)
    many: list[tuple[socket.socket, bytes]] = []
    try:
        per_address = _opened(one_address)
        many = _open_at_once(few_streams, [f"127.0.0.{20 + i % 5}" for i in range(30)])
        in_all = per_address + _opened(many)
        refused = [line for _, line in one_address + many if line.startswith(b"HTTP/1.1 429")]
    finally:
        for sock, _ in one_address + many:
            sock.close()

    assert per_address == 4
    assert in_all == 8
    assert len(refused) == 50 - 8

    def reopened() -> bool:  # the closed streams were uncounted
        answers = _open_at_once(few_streams, ["127.0.0.11"] * 4)
        for sock, _ in answers:
            sock.close()
        return _opened(answers) == 4

    wait_until(reopened, 60, "streams counted free again")
