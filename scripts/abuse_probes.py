"""The route-by-route stranger calls and the idle-stream measure of ``scripts/abuse``."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import time
from pathlib import Path
from typing import Any

from contracts.access import ACCESS_EXPIRY_HEADER, ACCESS_SIGNATURE_HEADER, ACCESS_TOKEN_HEADER
from contracts.messages import Voucher, task_bitmap
from scripts.abuse_attacks import DEAL_SCOPE, ZERO, Tally, client
from scripts.abuse_world import DEVICE_CLASS, World

# ---- 8. every route as a stranger -----------------------------------------------------------


def _credentials(world: World) -> dict[str, dict[str, Any]]:
    """Every way the attacker can dress up a call about the victim's deal."""
    victim, attacker = world.victim, world.attacker
    assert victim.task is not None
    domain = world.st.escrow.domain
    return {
        "stranger": {"headers": {}, "signature": ZERO},
        "stranger_signature": {
            "headers": world.proof(attacker.key, victim.deal_id, 0),
            "signature": victim.task.sign(domain, attacker.key),
        },
        "other_deal_token": {
            "headers": {ACCESS_TOKEN_HEADER: str(attacker.answer["access_token"])},
            "signature": attacker.signature,
        },
        "other_deal_proof": {
            "headers": world.proof(attacker.key, attacker.deal_id, DEAL_SCOPE),
            "signature": attacker.signature,
        },
        "replayed_proof": {
            "headers": world.proof(victim.key, victim.deal_id, 7),  # for another index
            "signature": attacker.signature,
        },
        "zero_signature": {
            "headers": {
                ACCESS_EXPIRY_HEADER: str(int(time.time()) + 60),
                ACCESS_SIGNATURE_HEADER: "0x" + ZERO.hex(),
            },
            "signature": ZERO,
        },
    }


class _Values(dict[str, str]):
    """Path parameters by name; one no probe knows is "0" (a route added later is called)."""

    def __missing__(self, key: str) -> str:
        return "0"


def routes_as_stranger(world: World, tally: Tally) -> dict[str, Any]:
    """Call every route of both OpenAPI documents with every credential of the attacker."""
    victim = world.victim
    assert victim.task is not None
    secrets = victim.secrets()
    domain = world.st.escrow.domain
    voucher = Voucher(deal_id=victim.deal_id, cumulative_amount=10**5, tasks=task_bitmap([0]))
    voucher_body = {
        "voucher": voucher.to_json(),
        "signature": "0x" + voucher.sign(domain, world.attacker.key).hex(),
    }
    values = _Values(
        deal_id=str(victim.deal_id),
        task_index="0",
        device_class=DEVICE_CLASS,
        order_id=world.victim_bid,
        address=victim.address,
    )
    calls = 0
    for service, base in (("daemon", world.daemon), ("market", world.market)):
        with client(base, "127.0.0.8") as http:
            paths = http.get("/openapi.json").json()["paths"]
            for name, credential in _credentials(world).items():
                for template, methods in paths.items():
                    path = template.format_map(
                        _Values(values, deal_id=world.market_deal)
                        if service == "market"
                        else values
                    )
                    for method in methods:
                        headers = dict(credential["headers"])
                        what = f"{name}: {method.upper()} {service} {template}"
                        write = False
                        if template == "/v1/stream":
                            with http.stream("GET", path, headers=headers) as reply:
                                tally.judge(reply, what, [])
                            calls += 1
                            continue
                        if method == "post" and template == "/v1/tasks":
                            headers.update(world.task_headers(victim.task, credential["signature"]))
                            reply = http.post(path, content=world.envelope, headers=headers)
                        elif method == "post" and template == "/v1/vouchers":
                            reply = http.post(path, json=voucher_body, headers=headers)
                            write = True
                        elif method == "post":
                            reply = http.post(path, json={}, headers=headers)
                            write = True
                        else:
                            reply = http.request(method.upper(), path, headers=headers)
                        party_only = service == "daemon" and (
                            "{deal_id}" in template or template == "/v1/tasks"
                        )
                        tally.judge(reply, what, secrets, party_only=party_only, write=write)
                        calls += 1
    return {"calls": calls}


# ---- idle live-update streams ---------------------------------------------------------------


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def idle_streams(world: World, count: int, span_s: float) -> dict[str, Any]:
    """Open ``count`` live-update streams (16 per source address, the cap), leave them idle
    and measure the market's CPU share over ``span_s``; then the same span with none open.

    The daemon is stopped (SIGSTOP) meanwhile: its heartbeat every 2 s changes the market,
    which would send every stream an update. Updates received during the span are counted.
    """
    os.kill(world.daemon_pid, signal.SIGSTOP)
    try:
        return _idle_streams(world, count, span_s)
    finally:
        os.kill(world.daemon_pid, signal.SIGCONT)


def _idle_streams(world: World, count: int, span_s: float) -> dict[str, Any]:
    port = int(world.market.rsplit(":", 1)[1])
    pid = world.market_pid
    socks = []
    updates = 0
    try:
        for n in range(count):
            host = f"127.0.3.{1 + n // 16}"
            sock = socket.create_connection(("127.0.0.1", port), source_address=(host, 0))
            sock.sendall(b"GET /v1/stream HTTP/1.1\r\nhost: market\r\n\r\n")
            socks.append(sock)
        opened = 0
        for sock in socks:
            sock.settimeout(30)
            data = b""
            with contextlib.suppress(OSError):
                while b"event: update" not in data and b"429" not in data[:20]:
                    chunk = sock.recv(4_096)
                    if not chunk:
                        break
                    data += chunk
            opened += b"event: update" in data
        before, started = _cpu_s(pid), time.monotonic()
        time.sleep(span_s)  # measuring the idle cost over a fixed span
        busy = (_cpu_s(pid) - before) / (time.monotonic() - started)
        for sock in socks:
            sock.setblocking(False)
            with contextlib.suppress(OSError):
                updates += sock.recv(65_536).count(b"event: update")
    finally:
        for sock in socks:
            sock.close()
    time.sleep(2)
    before, started = _cpu_s(pid), time.monotonic()
    time.sleep(span_s)
    idle = (_cpu_s(pid) - before) / (time.monotonic() - started)
    return {
        "streams": opened,
        "updates_during_span": updates,
        "span_s": span_s,
        "cpu_pct": round(100 * busy, 2),
        "no_streams_cpu_pct": round(100 * idle, 2),
        "cpu_us_per_s_per_idle_stream": round(1e6 * max(0.0, busy - idle) / max(1, opened), 2),
    }
