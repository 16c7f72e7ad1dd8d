"""Abuse run: the attacks of an attacker on the network, against a real stack, while a normal
client keeps working; every figure is measured.

anvil, the market and one staked provider daemon run as processes (``tests/e2e/stack.py``).
Two clients open deals with the provider and get a task delivered each (the victim's and the
attacker's own); the victim also has a deal matched through the market, with the quote the
provider's daemon attached. A normal client then places and cancels orders and submits tasks
on its own deal, pacing itself, while the attacks run one after the other:

1. the victim's used task request resent with zero, garbage, foreign and replayed signatures;
2. every provider-signed quote the market shows attached to the victim's matched deal;
3. ``[`` x 100,000 to the market's and the daemon's JSON routes;
4. a 1 MiB batch of 60,000 invalid orders, several times;
5. 200 MiB streamed as a task and as a voucher, and a signed voucher of the largest bitmap;
6. floods: orders and asks from an unfunded key, adverts of invented classes from unstaked
   keys, a funded key's orders beyond its funds, from many source addresses;
7. the daemon's deal summary unauthenticated, used and unused task indexes as a non-client,
   out-of-range numbers, the web page's headers, a non-JSON order, a bad compile target, 100
   slow connections to each service;
8. every route of both services' OpenAPI documents called as a stranger, as the client of
   another deal (its token and signatures) and with zero or replayed signatures;
9. the victim's task claimed on chain by the provider, its request and signature rebuilt from
   the ``claimReceipts`` calldata and posted to the daemon by the attacker
   (``scripts/abuse_replay.py``);
10. one address holding more slow connections than either service may hold in all while a
    normal client calls both (``scripts/abuse_flood.py``);
11. task submissions and signed reads for thousands of deal ids never opened;
12. 64 KB voucher bodies of thousands of unknown keys or bitmap words;
13. the victim's result tokens revoked by a stranger, then by the victim;
14. every fill of a fresh ask taken and never opened, then the chain's clock moved past each
    quote the daemon signs for them (``scripts/abuse_costs.py``);
15. hostile adverts (control characters, HTML, ``javascript:`` URLs in ``device_kind`` and
    ``endpoint``) signed by the staked provider's key;
16. invalid order batches within the size caps, the market's CPU per batch read from ``/proc``
    (``scripts/abuse_market_input.py``).

Then 1,000 live-update streams are opened and left idle (the normal client paused) and the
market's CPU share measured. The last line of stdout is one JSON object: ``unauthorized_reads``
(2xx answers that revealed the victim's task, deal or result to a non-party),
``unauthorized_writes`` (2xx to a stranger's voucher or a stranger's replayed task),
``terms_changed_by_stranger`` (the matched deal's quote terms after the attacks differ from the
ask's), ``services_crashed`` (processes dead or not answering their health check),
``server_errors`` (5xx answers), ``results_read_by_stranger`` (answers to attack 9 that carried
any of the victim's result: receipt, outputs, report, diagnosis or access token),
``secrets_in_responses`` (answers to the attacker that carried the node's URL or a key of the
run; ``tests/provider/test_api_secrets.py`` and ``tests/market/test_http_secrets.py`` run the
services with a key in the node's URL while the node errs),
``normal_refused_under_connection_flood`` (the normal calls of attack 10 that failed),
``max_stall_ms_normal`` (the longest any one call of the normal client took during the
attacks; by attack in ``max_stall_ms_normal_by_attack``), ``stake_locked_by_unopened_quotes``
(the stake the quotes of attack 14's fills still hold, valid and unopened, once each fill has
used the quotes the window rules allow: ``provider/quotes.py``; while the first are valid:
``stake_held_by_unopened_quotes_while_valid``),
``normal_p99_ms_under_abuse`` (the normal client's order placements, cancels and task
submissions during the attacks; ``normal_p99_ms_alone``: the same calls in the 30 s before
them), ``peak_rss_mb`` (VmHWM of market + daemon), ``hostile_adverts_stored`` (attack 15's adverts
answered 2xx or served back by the market), ``invalid_batch_cpu_ms_p50`` (the market's CPU per
refused batch of attack 16),
``idle_streams_cpu_pct_1000``, then each attack's own figures.

Usage: scripts/abuse [--quick] [--work-dir DIR]

``--quick`` (the e2e test, ``tests/e2e/test_abuse.py``): smaller floods and uploads, no slow
connections and no idle streams (``tests/market/test_hostile_http.py`` and
``tests/provider/test_daemon_connections.py`` run those against each service).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("JAX_PLATFORMS", "cpu")
REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from scripts.abuse_attacks import ATTACKS, Tally  # noqa: E402
from scripts.abuse_costs import COST_ATTACKS, unopened_fills  # noqa: E402
from scripts.abuse_flood import connection_flood  # noqa: E402
from scripts.abuse_market_input import MARKET_INPUT_ATTACKS  # noqa: E402
from scripts.abuse_probes import idle_streams, routes_as_stranger  # noqa: E402
from scripts.abuse_replay import claimed_replay  # noqa: E402
from scripts.abuse_world import World, build_world, normal_client  # noqa: E402
from tests.e2e.stack import stack  # noqa: E402


def say(line: str) -> None:
    """Progress on stderr (stdout ends with the JSON line)."""
    print(f"[{time.strftime('%H:%M:%S')}] {line}", file=sys.stderr, flush=True)


def peak_rss_mb(pid: int) -> float:
    """Return a process's peak resident memory so far (``VmHWM``), in MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0.0


def percentile(values: list[float], share: float) -> float:
    """Return the value below which ``share`` of ``values`` lie (nearest rank)."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(share * len(ordered)) - 1))]


def run(world: World, quick: bool) -> dict[str, Any]:
    """Run every attack while the normal client works; return the figures."""
    tally = Tally()
    st = world.st
    keys = [world.provider.key, st.deployer, world.victim.key, world.attacker.key]
    tally.node_secrets = [st.rpc_url] + [k.removeprefix("0x") for k in keys]
    stop = threading.Event()
    normal = threading.Thread(target=normal_client, args=(world, stop), daemon=True)
    normal.start()
    time.sleep(5.0 if quick else 30.0)  # the normal client alone first: its figures unloaded
    baseline, world.normal.latencies_ms, world.normal.by_kind = world.normal.latencies_ms, [], {}
    say(f"normal client alone: p99 {percentile(baseline, 0.99):.1f} ms over {len(baseline)} calls")
    started = time.monotonic()
    down: set[str] = set()  # services found dead or not answering after any attack
    try:
        for name, attack in ATTACKS + COST_ATTACKS + MARKET_INPUT_ATTACKS:
            world.normal.phase = name
            began = time.monotonic()
            figures = attack(world, tally, quick)
            tally.figures[name] = figures
            alive = world.alive()
            down |= {service for service, up in alive.items() if not up}
            say(f"{name}: {json.dumps(figures)} ({time.monotonic() - began:.1f} s); up: {alive}")
        world.normal.phase = "8_routes_as_stranger"
        tally.figures["routes_as_stranger"] = routes_as_stranger(world, tally)
        say(f"routes as stranger: {json.dumps(tally.figures['routes_as_stranger'])}")
        world.normal.phase = "9_claimed_replay"
        tally.figures["9_claimed_replay"] = claimed_replay(world, tally)
        say(f"claimed replay: {json.dumps(tally.figures['9_claimed_replay'])}")
        world.normal.phase = "10_connection_flood"
        tally.figures["10_connection_flood"] = connection_flood(world, tally, quick)
        say(f"connection flood: {json.dumps(tally.figures['10_connection_flood'])}")
        world.normal.phase = "14_unopened_fills"  # last: it moves the chain's clock on
        tally.figures["14_unopened_fills"] = unopened_fills(world, tally, quick)
        say(f"unopened fills: {json.dumps(tally.figures['14_unopened_fills'])}")
    finally:
        abuse_s = time.monotonic() - started
        stop.set()
        normal.join(60)
    streams: dict[str, Any] = {}
    if not quick:  # the short run leaves the streams to tests/market/test_hostile_http.py
        streams = idle_streams(world, 1_000, 30.0)
        say(f"idle streams: {json.dumps(streams)}")
    down |= {service for service, up in world.alive().items() if not up}
    latencies = world.normal.latencies_ms
    return {
        "unauthorized_reads": tally.unauthorized_reads,
        "unauthorized_writes": tally.unauthorized_writes,
        "terms_changed_by_stranger": tally.terms_changed,
        "services_crashed": len(down),
        "server_errors": tally.server_errors,
        "results_read_by_stranger": tally.results_read_by_stranger,
        "secrets_in_responses": tally.secrets_in_responses,
        "normal_refused_under_connection_flood": tally.normal_refused_under_flood,
        "slow_connections_left_open": tally.slow_connections_left,
        "max_stall_ms_normal": round(max(latencies, default=0.0), 1),
        "max_stall_ms_normal_by_attack": {
            phase: round(max(ms), 1)
            for phase, ms in world.normal.by_phase.items()
            if phase != "alone"
        },
        "max_stall_ms_normal_by_call": {
            kind: round(max(ms), 1) for kind, ms in world.normal.by_kind.items()
        },
        "stake_locked_by_unopened_quotes": tally.figures["14_unopened_fills"][
            "stake_locked_after_window"
        ],
        "stake_held_by_unopened_quotes_while_valid": tally.figures["14_unopened_fills"][
            "stake_held_while_valid"
        ],
        "hostile_adverts_stored": tally.figures["15_hostile_adverts"]["hostile_adverts_stored"],
        "invalid_batch_cpu_ms_p50": tally.figures["16_invalid_batches"]["invalid_batch_cpu_ms_p50"],
        "normal_p99_ms_under_abuse": round(percentile(latencies, 0.99), 1),
        "normal_p50_ms_under_abuse": round(percentile(latencies, 0.50), 1),
        "normal_p99_ms_alone": round(percentile(baseline, 0.99), 1),
        "normal_p50_ms_alone": round(percentile(baseline, 0.50), 1),
        "normal_p99_ms_by_call": {
            kind: round(percentile(ms, 0.99), 1) for kind, ms in world.normal.by_kind.items()
        },
        "normal_p99_ms_by_attack": {
            phase: round(percentile(ms, 0.99), 1)
            for phase, ms in world.normal.by_phase.items()
            if phase != "alone"
        },
        "normal_calls": len(latencies),
        "normal_errors": len(world.normal.errors),
        "normal_error_samples": world.normal.errors[:5],
        "normal_tasks_acked": len(world.normal.tasks_acked),
        "normal_tasks_delivered": world.normal_delivered(),
        "normal_orders_placed": world.normal.orders_placed,
        "peak_rss_mb": round(peak_rss_mb(world.market_pid) + peak_rss_mb(world.daemon_pid)),
        "market_peak_rss_mb": round(peak_rss_mb(world.market_pid)),
        "daemon_peak_rss_mb": round(peak_rss_mb(world.daemon_pid)),
        "idle_streams_cpu_pct_1000": streams.get("cpu_pct"),
        "idle_streams": streams,
        "attack_calls": tally.calls,
        "findings": tally.leaks[:20],
        "abuse_s": round(abuse_s, 1),
        "attacks": tally.figures,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="the short run of the e2e test")
    parser.add_argument("--work-dir", type=Path, default=None, help="default: a temp dir")
    args = parser.parse_args(argv)
    started = time.monotonic()
    work = args.work_dir or Path(tempfile.mkdtemp(prefix="tpumarket-abuse-"))
    work.mkdir(parents=True, exist_ok=True)
    say(f"work dir {work}")
    with stack(work, market=True) as st:
        world = build_world(st, say)
        say(f"stack ready in {time.monotonic() - started:.0f} s")
        figures = run(world, args.quick)
        world.close()
    figures["duration_s"] = round(time.monotonic() - started, 1)
    print(json.dumps(figures), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
