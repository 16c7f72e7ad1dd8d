"""The market-input probes of ``scripts/abuse`` (issue 22, items 4 and 6), run as the attacker
while the normal client works:

15. hostile provider adverts: control characters, HTML and ``javascript:`` URLs in
    ``device_kind`` and ``endpoint``, signed by the staked provider's key (the attacker holds
    it here: the market's check must not rest on who signs). ``hostile_adverts_stored``
    counts the adverts answered 2xx or whose hostile text the market serves back
    (``/v1/providers``, ``/v1/providers/{address}``, the page);
16. invalid order batches within the size caps (a bad shape, a bad last field, a forged last
    signature, an expired last order, a repeated nonce): ``invalid_batch_cpu_ms_p50`` is the
    market's CPU per refused batch (user + system, from ``/proc``, as
    ``scripts/bench_invalid_batches.py`` reads it; the median over the kinds of each kind's
    CPU over its batches), ``invalid_batches_accepted`` the 2xx.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

from scripts.abuse_attacks import JSON, Tally, client
from scripts.abuse_world import World
from scripts.bench_invalid_batches import batches, cpu_s
from tests.market.signing import Trader

HOSTILE: list[tuple[str, str]] = [
    ("device_kind", "TPU\x1b[31m v5\x07"),
    ("device_kind", "TPU\u202ev5 lite\u200b"),
    ("device_kind", "<script>alert(1)</script>"),
    ("device_kind", '<img src=x onerror="alert(1)">'),
    ("device_kind", "line\nbreak\rTPU"),
    ("endpoint", "javascript:alert(1)"),
    ("endpoint", "JavaScript:alert(document.cookie)//http://x"),
    ("endpoint", "http://x/<script>alert(1)</script>"),
    ("endpoint", "http://user:pw@provider.example:8080"),
    ("endpoint", "http://provider.example\x00.evil"),
    ("endpoint", "data:text/html,<b>x</b>"),
]


def _served(world: World, texts: list[str]) -> set[str]:
    """Return those of ``texts`` the market serves back anywhere a visitor reads adverts."""
    with client(world.market, "127.0.3.2") as http:
        bodies = [
            http.get("/v1/providers").text,
            http.get(f"/v1/providers/{world.provider.address}").text,
            http.get("/").text,
        ]
    return {t for t in texts if any(t in body or t.replace('"', '\\"') in body for body in bodies)}


def hostile_adverts(world: World, tally: Tally, quick: bool) -> dict[str, Any]:
    """Post each hostile advert signed by the staked provider's key; count what is kept."""
    chain_id, escrow = world.st.escrow.domain.chain_id, world.st.escrow.address
    signer = Trader(key=world.provider.key, chain_id=chain_id, escrow=escrow)
    statuses: dict[str, int] = {}
    accepted: set[str] = set()
    with client(world.market, "127.0.3.1") as http:
        for field, text in HOSTILE:
            advert = signer.heartbeat(int(time.time()), **{field: text})
            reply = http.post("/v1/providers/heartbeat", json=advert)
            tally.judge(reply, f"hostile advert ({field})", [])  # counted below
            statuses[str(reply.status_code)] = statuses.get(str(reply.status_code), 0) + 1
            if reply.status_code < 300:
                accepted.add(text)
    served = _served(world, [t for _, t in HOSTILE])
    stored = accepted | served
    if stored:
        tally.leaks.append(f"hostile adverts kept: {sorted(stored)[:3]!r}")
    return {
        "hostile_adverts_sent": len(HOSTILE),
        "hostile_adverts_stored": len(stored),
        "hostile_adverts_served_back": len(served),
        "statuses": dict(sorted(statuses.items())),
    }


def invalid_batches(world: World, tally: Tally, quick: bool) -> dict[str, Any]:
    """Post invalid batches within the caps, one at a time; the market's CPU per batch.

    ``/proc`` counts CPU in clock ticks (10 ms): each kind's CPU is read over all its batches
    and divided by their number; the p50 is over the kinds."""
    repeat = 10 if quick else 40
    pid = world.market_pid
    now = world.st.anvil.latest_timestamp()
    by_kind: dict[str, float] = {}
    sent = accepted = 0
    with client(world.market, "127.0.3.3") as http:
        for kind, body in batches(now).items():
            before = cpu_s(pid)
            for _ in range(repeat):
                reply = http.post("/v1/orders/batch", content=body, headers=JSON)
                tally.judge(reply, f"invalid batch ({kind})", [], write=True)
                accepted += reply.status_code < 300
                sent += 1
            by_kind[kind] = round(1_000 * (cpu_s(pid) - before) / repeat, 1)
    return {
        "invalid_batches_sent": sent,
        "invalid_batches_accepted": accepted,
        "invalid_batch_cpu_ms_p50": round(statistics.median(by_kind.values()), 1),
        "invalid_batch_cpu_ms_by_kind": by_kind,
    }


MARKET_INPUT_ATTACKS = [
    ("15_hostile_adverts", hostile_adverts),
    ("16_invalid_batches", invalid_batches),
]
