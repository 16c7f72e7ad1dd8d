"""The cost probes of ``scripts/abuse`` (issue 22, items 4 and 5, and token revocation): each
runs as the attacker while the normal client works, and counts what it got.

11. task submissions and signed reads for thousands of deal ids never opened, from several
    source addresses at once (the daemon reads no deal on its event loop, caches what is
    missing and bounds its reads);
12. 64 KB voucher bodies with thousands of unknown keys, and bitmaps of thousands of words
    (refused on their shape, before any lookup or signature check);
13. the victim's result tokens revoked by a stranger (refused) and by the victim (its old token
    reads nothing afterwards);
14. fills of a provider's ask taken and never opened: the stake the daemon holds for their
    quotes, while they are valid and once the quote window rules have run their course
    (``stake_locked_by_unopened_quotes``).
"""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any

import httpx

from contracts.access import ACCESS_TOKEN_HEADER, result_access_digest
from contracts.chain import rpc
from contracts.messages import KIND_INFERENCE, ZERO_ADDRESS, TaskRequest, sign_digest
from scripts.abuse_attacks import JSON, Tally, client
from scripts.abuse_world import DEVICE_CLASS, PRICE, QUOTE_VALID_S, SLO_MS, World
from tests.e2e.stack import UNIT, post_ask
from tests.market.signing import Trader

UNKNOWN = 10**12  # deal ids from here on are never opened in the run
DEAL_SCOPE = 2**256 - 1  # provider.access.DEAL_SCOPE
REVOKE_SCOPE = 2**256 - 2  # provider.access.REVOKE_SCOPE
GRIEF_FILLS = 4
GRIEF_PRICE = PRICE // 2  # below every other ask: the attacker's bids take these fills
MAX_QUOTES_PER_FILL = 3  # provider.quotes.MAX_QUOTES_PER_FILL


def _statuses(replies: list[int]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for status in replies:
        counts[str(status)] = counts.get(str(status), 0) + 1
    return dict(sorted(counts.items()))


# ---- 11. unknown deals ----------------------------------------------------------------------


def _unknown_deal_call(world: World, n: int, expiry: int) -> tuple[str, str, dict[str, str]]:
    """Return (method, path, headers) of the attacker's ``n``-th call for a deal never opened:
    a task submission, a signed result read or a signed deal summary, in turn."""
    deal_id, key, domain = UNKNOWN + n, world.attacker.key, world.st.escrow.domain
    if n % 3 == 0:
        request = TaskRequest(
            deal_id=deal_id,
            task_index=0,
            kind=KIND_INFERENCE,
            program_hash=world.program_hash,
            input_hash=world.input_hash,
            max_price=1_000,
            deadline=expiry,
        )
        return "POST", "/v1/tasks", world.task_headers(request, request.sign(domain, key))
    index = 0 if n % 3 == 1 else DEAL_SCOPE
    digest = result_access_digest(domain, deal_id, index, expiry)
    proof = {
        "X-Tpumarket-Access-Expiry": str(expiry),
        "X-Tpumarket-Access-Signature": "0x" + sign_digest(digest, key).hex(),
    }
    return "GET", f"/v1/tasks/{deal_id}/0" if index == 0 else f"/v1/deals/{deal_id}", proof


def unknown_deals(world: World, tally: Tally, quick: bool) -> dict[str, Any]:
    """Task submissions, signed result reads and deal summaries for deal ids never opened,
    signed beforehand (the attacker's own signing would take the normal client's CPU here)."""
    count = 300 if quick else 3_000
    expiry = int(time.time()) + 600
    calls = [_unknown_deal_call(world, n, expiry) for n in range(count)]
    sources = [f"127.0.3.{n}" for n in range(1, 9)]

    def one(n: int) -> tuple[int, float]:
        method, path, headers = calls[n]
        with client(world.daemon, sources[n % len(sources)]) as http:
            started = time.perf_counter()
            body = world.envelope if method == "POST" else None
            reply = http.request(method, path, headers=headers, content=body)
            ms = (time.perf_counter() - started) * 1000
        tally.judge(reply, "unknown deal", world.victim.secrets(), party_only=True)
        return reply.status_code, ms

    with ThreadPoolExecutor(max_workers=8) as pool:
        results = list(pool.map(one, range(count)))
    return {
        "calls": count,
        "statuses": _statuses([s for s, _ in results]),
        "max_ms": round(max(ms for _, ms in results), 1),
    }


# ---- 12. voucher bodies of unknown keys -----------------------------------------------------


def voucher_keys(world: World, tally: Tally, quick: bool) -> dict[str, Any]:
    """64 KB voucher bodies: thousands of unknown keys in the voucher or the body, and a bitmap
    of thousands of words, for the victim's deal and signed with a made-up signature."""
    count = 60 if quick else 600
    deal_id = world.victim.deal_id
    junk = {f"key{i}": i for i in range(3_800)}
    voucher = {"deal_id": deal_id, "cumulative_amount": 10**6, "tasks": ["1"]}
    bodies = [
        json.dumps({"voucher": {**voucher, **junk}, "signature": "0x" + "ab" * 65}),
        json.dumps({"voucher": voucher, "signature": "0x" + "ab" * 65, **junk}),
        json.dumps({"voucher": {**voucher, "tasks": [str(2**255)] * 600}, "signature": "0x"}),
    ]
    assert all(len(body) <= 64 * 1024 for body in bodies)

    def one(n: int) -> tuple[int, float]:
        with client(world.daemon, f"127.0.4.{1 + n % 8}") as http:
            started = time.perf_counter()
            reply = http.post("/v1/vouchers", content=bodies[n % len(bodies)], headers=JSON)
            ms = (time.perf_counter() - started) * 1000
        tally.judge(reply, "voucher of unknown keys", [], write=True)
        return reply.status_code, ms

    with ThreadPoolExecutor(max_workers=8) as pool:
        results = list(pool.map(one, range(count)))
    return {
        "calls": count,
        "body_bytes": max(len(body) for body in bodies),
        "statuses": _statuses([s for s, _ in results]),
        "max_ms": round(max(ms for _, ms in results), 1),
    }


# ---- 13. token revocation -------------------------------------------------------------------


def revocation(world: World, tally: Tally, quick: bool) -> dict[str, Any]:
    """A stranger revokes the victim's tokens (refused); the victim does (its token then reads
    nothing)."""
    victim, domain = world.victim, world.st.escrow.domain
    token = str(victim.answer.get("access_token", ""))
    assert victim.task is not None and token
    index = victim.task.task_index
    path = f"/v1/deals/{victim.deal_id}/access/revoke"

    def body(key: str, before: int) -> dict[str, Any]:
        digest = result_access_digest(domain, victim.deal_id, REVOKE_SCOPE, before)
        return {"before": before, "signature": "0x" + sign_digest(digest, key).hex()}

    figures: dict[str, Any] = {}
    with (
        client(world.daemon, "127.0.0.8") as attacker,
        httpx.Client(base_url=world.daemon, timeout=60) as owner,
    ):
        read = f"/v1/tasks/{victim.deal_id}/{index}"
        before = owner.get(read, headers={ACCESS_TOKEN_HEADER: token})
        figures["token_reads_before"] = before.status_code
        now = int(time.time())
        reply = attacker.post(path, json=body(world.attacker.key, now))
        tally.judge(reply, "revocation by a stranger", [], write=True)
        figures["stranger_revocation"] = reply.status_code
        mine = owner.post(path, json=body(victim.key, now))
        figures["owner_revocation"] = mine.status_code
        replayed = attacker.post(path, json=body(victim.key, now - 10))  # an older cut-off
        tally.calls += 1
        figures["replayed_revocation_cutoff"] = replayed.json().get("revoked_through")
        after = attacker.get(read, headers={ACCESS_TOKEN_HEADER: token})
        tally.judge(after, "revoked token", victim.secrets()[1:], party_only=True)
        figures["revoked_token_reads"] = int(after.status_code < 300)
        figures["revoked_token_status"] = after.status_code
    return figures


# ---- 14. fills never opened -----------------------------------------------------------------


def _attacker_fills(world: World, market: httpx.Client) -> list[dict[str, Any]]:
    deals = market.get("/v1/deals", params={"party": world.provider.address, "limit": 500}).json()
    rows = deals if isinstance(deals, list) else deals.get("deals", [])
    mine = world.attacker.address.lower()
    return [
        d
        for d in rows
        if str(d.get("client", "")).lower() == mine and int(d.get("price", 0)) == GRIEF_PRICE
    ]


def held_stake(fills: list[dict[str, Any]], chain_now: int) -> int:
    """The stake of the fills' quotes that name their client, are unopened and still valid."""
    held = 0
    for fill in fills:
        quote = fill.get("quote")
        if fill.get("chain_deal_id") is not None or not isinstance(quote, dict):
            continue
        if str(quote.get("client", "")).lower() != str(fill.get("client", "")).lower():
            continue
        if int(quote.get("valid_until", 0)) >= chain_now:
            held += int(quote.get("stake", 0))
    return held


def _refused(world: World) -> float:
    """The daemon's count of quotes it refused to sign (an abandoned fill is refused)."""
    text = httpx.get(world.daemon + "/metrics", timeout=30).text
    for line in text.splitlines():
        if line.startswith('tpumarket_provider_quotes_total{result="refused"}'):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def unopened_fills(world: World, tally: Tally, quick: bool) -> dict[str, Any]:
    """Take every fill of a fresh ask and open none; measure the stake their quotes hold."""
    st, provider = world.st, world.provider
    terms = st.quote(provider, max_spend=GRIEF_PRICE * GRIEF_FILLS, client=ZERO_ADDRESS)
    post_ask(st, provider, replace(terms, stake=UNIT), price=GRIEF_PRICE, quantity=GRIEF_FILLS)
    trader = Trader(
        key=world.attacker.key, chain_id=st.escrow.domain.chain_id, escrow=st.escrow.address
    )
    fields = {"device_class": DEVICE_CLASS, "price": GRIEF_PRICE, "quantity": 1, "plan": "flat"}
    fields |= {"slo_ms": SLO_MS, "memory": 0}
    figures: dict[str, Any] = {"ask_stake": UNIT, "bid_statuses": []}

    def held() -> int:
        return held_stake(_attacker_fills(world, market), st.anvil.latest_timestamp())

    with client(world.market, "127.0.0.9") as market:
        for _ in range(GRIEF_FILLS):
            reply = market.post("/v1/orders", json=trader.bid(int(time.time()), **fields))
            tally.calls += 1
            figures["bid_statuses"].append(reply.status_code)
        figures["quoted"] = _wait(lambda: held() > 0, 120)
        figures["fills_matched"] = len(_attacker_fills(world, market))
        figures["stake_held_while_valid"] = held()
        # The quote window rules: an expired quote is signed anew while the match stands, at
        # most MAX_QUOTES_PER_FILL times; then the fill is abandoned and holds nothing.
        rounds = 0
        while rounds <= MAX_QUOTES_PER_FILL:
            quotes = [f["quote"] for f in _attacker_fills(world, market) if f.get("quote")]
            if not quotes:
                break
            end = max(int(q["valid_until"]) for q in quotes)
            refused = _refused(world)
            with world.normal.chain_clock:  # no task of the normal client signed meanwhile
                jump = max(0, end - st.anvil.latest_timestamp()) + 1
                rpc(st.anvil.url, "evm_increaseTime", [jump])
                rpc(st.anvil.url, "evm_mine")
            rounds += 1
            # Until every fill is quoted anew, or the daemon refuses one (abandoned).
            _wait(lambda n=refused: held() > 0 or _refused(world) > n, QUOTE_VALID_S)
            if held() == 0:
                break
        figures["expiry_rounds"] = rounds
        figures["stake_locked_after_window"] = held()
    return figures


def _wait(condition: Any, limit_s: float) -> bool:
    """Poll ``condition`` every 0.5 s up to ``limit_s``; return whether it came true."""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.5)
    return bool(condition())


COST_ATTACKS = [
    ("11_unknown_deals", unknown_deals),
    ("12_voucher_keys", voucher_keys),
    ("13_revocation", revocation),
]
"""Run with the others while the normal client works; 14 runs last (it moves the chain's
clock past the quotes' window)."""
