"""The daemon served by its CLI (real uvicorn, real sockets) against slow and idle clients.

A connection that sends nothing, or a request that drips in a byte a second, is closed after
the configured timeouts (a 408 when its headers never completed), while a normal client is
served meanwhile; a compile target header that is no target name is a 400 before the body.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from tests.polling import hang_ceiling_s
from tests.provider.daemon_support import (
    ChainWorld,
    ServedDaemon,
    served_daemon,
    sign_task,
    tiny_mlp_envelope,
)

KEEP_ALIVE_S = 1
READ_TIMEOUT_S = 2
SLACK_S = 3  # on an idle host; a loaded one runs the timer late: scaled by `hang_ceiling_s`
# (at most 30 s), still far short of what the drip itself would last (minutes)


@pytest.fixture(scope="module")
def served(
    chain_world: ChainWorld, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServedDaemon]:
    settings = f"keep_alive_s = {KEEP_ALIVE_S}\nrequest_read_timeout_s = {READ_TIMEOUT_S}\n"
    work = tmp_path_factory.mktemp("daemon-connections")
    with served_daemon(chain_world, work, settings=settings) as daemon:
        yield daemon


def _drip(sock: socket.socket, data: bytes, limit_s: float) -> tuple[float, bytes]:
    """Send `data` one byte a second until the daemon closes; return (seconds, bytes read)."""
    started = time.monotonic()
    received = b""
    sock.settimeout(1.0)
    for byte in data:
        try:
            sock.send(bytes([byte]))
            chunk = sock.recv(4_096)  # waits up to a second: the drip's pace
        except TimeoutError:
            continue
        except OSError:
            break
        if not chunk:
            break
        received += chunk
        if time.monotonic() - started > limit_s:
            break
    return time.monotonic() - started, received


def test_connection_when_it_sends_nothing_then_closed_after_the_keep_alive(
    served: ServedDaemon,
) -> None:
    with socket.create_connection(("127.0.0.1", served.port)) as sock:
        sock.settimeout(KEEP_ALIVE_S + 60)
        started = time.monotonic()
        assert sock.recv(1) == b""  # closed by the daemon, never having sent a byte
        assert time.monotonic() - started < KEEP_ALIVE_S + hang_ceiling_s(SLACK_S)


def test_connection_when_idle_after_an_answer_then_closed(served: ServedDaemon) -> None:
    with socket.create_connection(("127.0.0.1", served.port)) as sock:
        sock.sendall(b"GET /v1/health HTTP/1.1\r\nhost: daemon\r\n\r\n")
        sock.settimeout(KEEP_ALIVE_S + 60)
        data = b""
        while b"}" not in data:
            data += sock.recv(4_096)
        started = time.monotonic()
        assert sock.recv(1) == b""
        assert time.monotonic() - started < KEEP_ALIVE_S + hang_ceiling_s(SLACK_S)


def test_headers_when_sent_a_byte_a_second_then_408_and_closed(served: ServedDaemon) -> None:
    request = b"GET /v1/health HTTP/1.1\r\nhost: daemon\r\nx-pad: " + b"a" * 60 + b"\r\n\r\n"
    with socket.create_connection(("127.0.0.1", served.port)) as sock:
        seconds, received = _drip(sock, request, READ_TIMEOUT_S + 20)
    assert received.startswith(b"HTTP/1.1 408")
    assert b'"error":"request_timeout"' in received
    assert seconds < READ_TIMEOUT_S + hang_ceiling_s(SLACK_S)


def test_voucher_body_when_sent_a_byte_a_second_then_closed(served: ServedDaemon) -> None:
    head = (
        b"POST /v1/vouchers HTTP/1.1\r\nhost: daemon\r\ncontent-type: application/json\r\n"
        b"content-length: 500\r\n\r\n"
    )
    with socket.create_connection(("127.0.0.1", served.port)) as sock:
        sock.sendall(head)
        seconds, _ = _drip(sock, b" " * 500, READ_TIMEOUT_S + 20)
    assert seconds < READ_TIMEOUT_S + hang_ceiling_s(SLACK_S)
    assert served.healthy()


def test_slowloris_when_100_connections_drip_then_a_normal_client_is_served_and_all_are_cut(
    served: ServedDaemon,
) -> None:
    socks = [socket.create_connection(("127.0.0.1", served.port)) for _ in range(100)]
    try:
        for sock in socks:
            sock.sendall(b"GET /v1/health HTTP/1.1\r\n")
        with httpx.Client(base_url=served.url, timeout=30) as normal:
            answers = [normal.get("/v1/health").status_code for _ in range(10)]
        for sock in socks:
            sock.settimeout(READ_TIMEOUT_S + 30)
        with ThreadPoolExecutor(max_workers=16) as pool:
            cut = list(pool.map(lambda s: s.recv(4_096), socks))
    finally:
        for sock in socks:
            sock.close()
    assert answers == [200] * 10
    assert all(answer.startswith(b"HTTP/1.1 408") for answer in cut)
    assert served.healthy()


def test_upload_when_it_arrives_at_a_fair_rate_past_the_read_timeout_then_read_whole(
    served: ServedDaemon, chain_world: ChainWorld
) -> None:
    """2 MiB streamed over 2.4 read timeouts (~400 KiB/s, above the minimum upload rate) is
    read whole and judged: not an envelope (422), where a cut connection would get no answer."""
    deal_id = chain_world.open_deal(client=chain_world.client)
    task = sign_task(chain_world, chain_world.client, deal_id, 0, tiny_mlp_envelope()[0])
    pieces, size = 16, 128 * 1024

    def slow_body() -> Iterator[bytes]:
        for _ in range(pieces):
            time.sleep(READ_TIMEOUT_S * 0.15)  # the upload's own pace: 2.4 read timeouts in all
            yield b"\0" * size

    with httpx.Client(base_url=served.url, timeout=60) as client:
        reply = client.post(
            "/v1/tasks",
            content=slow_body(),
            headers={**task.headers(), "Content-Length": str(pieces * size)},
        )

    assert reply.status_code == 422, reply.text
    assert reply.json()["error"] == "envelope_malformed"


@pytest.mark.parametrize("target", ["v5e 1x1", "x" * 65, "\u00e9t\u00e9", ""])
def test_compile_target_when_not_a_target_name_then_400_before_the_body(
    served: ServedDaemon, chain_world: ChainWorld, target: str
) -> None:
    deal_id = chain_world.open_deal(client=chain_world.client)
    task = sign_task(chain_world, chain_world.client, deal_id, 0, tiny_mlp_envelope()[0])
    headers = {**task.headers(), "X-Tpumarket-Target": target}

    reply = httpx.post(
        served.url + "/v1/tasks",
        content=task.body,
        headers={k.encode(): v.encode("latin-1", "replace") for k, v in headers.items()},
        timeout=30,
    )

    assert reply.status_code == 400, reply.text
    assert reply.json()["error"] == "bad_request"
    assert "X-Tpumarket-Target" in reply.json()["reason"]
