"""The attacks of ``scripts/abuse``, each counting what it got (see ``scripts/abuse.py``)."""

from __future__ import annotations

import contextlib
import json
import socket
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import httpx

from client.accounts import TERMS
from contracts.messages import Quote, Voucher
from scripts.abuse_world import DEVICE_CLASS, SLO_MS, World
from tests.market.signing import Trader

ZERO = b"\0" * 65
JSON = {"content-type": "application/json"}
DEAL_SCOPE = 2**256 - 1  # the task index of a deal-summary proof (provider.access.DEAL_SCOPE)


@dataclass
class Tally:
    """The counts every attack adds to."""

    unauthorized_reads: int = 0
    unauthorized_writes: int = 0
    terms_changed: int = 0
    server_errors: int = 0
    calls: int = 0
    slow_connections_left: int = 0
    results_read_by_stranger: int = 0
    secrets_in_responses: int = 0
    normal_refused_under_flood: int = 0
    node_secrets: list[str] = field(default_factory=list)
    """The node URL and the keys of the run: in no answer to anyone."""
    figures: dict[str, Any] = field(default_factory=dict)
    leaks: list[str] = field(default_factory=list)

    def judge(
        self,
        reply: httpx.Response,
        what: str,
        secrets: list[str],
        *,
        party_only: bool = False,
        write: bool = False,
    ) -> None:
        """Count one answer to a non-party: a 5xx, a 2xx write, a 2xx of a party-only route
        or any answer carrying a party's secret."""
        self.calls += 1
        self.scan(reply, what)
        status = reply.status_code
        if status >= 500:
            self.server_errors += 1
            self.leaks.append(f"{what}: {status}")
        ok = 200 <= status < 300
        if ok and write:
            self.unauthorized_writes += 1
            self.leaks.append(f"{what}: write accepted")
        elif (ok and party_only) or any(s in reply.text for s in secrets):
            self.unauthorized_reads += 1
            self.leaks.append(f"{what}: {status} revealed the victim's data")

    def scan(self, reply: httpx.Response, what: str) -> None:
        """Count an answer whose body or headers carry the node URL or a key of the run."""
        try:
            text = reply.text
        except httpx.ResponseNotRead:  # a stream left open: its headers only
            text = ""
        shown = text + " ".join(f"{k}: {v}" for k, v in reply.headers.items())
        found = [s for s in self.node_secrets if s and s in shown]
        if found:
            self.secrets_in_responses += 1
            self.leaks.append(f"{what}: {reply.status_code} carried a secret of the run")


def client(base: str, source: str, timeout: float = 60) -> httpx.Client:
    """Return an HTTP client whose connections come from ``source`` (a 127.x address)."""
    return httpx.Client(
        base_url=base, timeout=timeout, transport=httpx.HTTPTransport(local_address=source)
    )


def _timed(call: Callable[[], httpx.Response]) -> tuple[httpx.Response, float]:
    started = time.perf_counter()
    reply = call()
    return reply, (time.perf_counter() - started) * 1000


# ---- 1. replayed task requests ---------------------------------------------------------------


def replay(world: World, tally: Tally, quick: bool) -> dict[str, Any]:
    """Resend the victim's used task request with zero, garbage, foreign, replayed signatures."""
    victim, attacker = world.victim, world.attacker
    assert victim.task is not None
    domain = world.st.escrow.domain
    signatures = {
        "zero": ZERO,
        "garbage": b"\xab" * 65,
        "foreign": victim.task.sign(domain, attacker.key),
        "replayed": attacker.signature,
    }
    statuses = {}
    with client(world.daemon, "127.0.0.2") as http:
        for name, signature in signatures.items():
            headers = world.task_headers(victim.task, signature)
            reply = http.post("/v1/tasks", content=world.envelope, headers=headers)
            tally.judge(reply, f"replay {name}", victim.secrets(), party_only=True)
            statuses[name] = reply.status_code
    return {"statuses": statuses}


# ---- 2. quotes swapped on a matched deal -----------------------------------------------------


def _quotes_in(value: Any) -> Iterator[tuple[dict[str, Any], str]]:
    """Yield every (quote, signature) pair in a JSON document."""
    if isinstance(value, dict):
        if isinstance(value.get("quote"), dict) and isinstance(value.get("quote_signature"), str):
            yield value["quote"], value["quote_signature"]
        for inner in value.values():
            yield from _quotes_in(inner)
    elif isinstance(value, list):
        for inner in value:
            yield from _quotes_in(inner)


def _terms(quote: dict[str, Any] | None) -> Any:
    return None if quote is None else json.dumps([quote.get(k) for k in TERMS], sort_keys=True)


def quote_swap(world: World, tally: Tally, quick: bool) -> dict[str, Any]:
    """Attach every provider-signed quote the market shows (and one of the attacker's own) to
    the victim's matched deal; the deal's terms must stay the ask's."""
    path = f"/v1/deals/{world.market_deal}"
    with client(world.market, "127.0.0.3") as http:
        before = http.get(path).json()["quote"]
        found = list(_quotes_in(http.get("/v1/orders", params={"limit": 500}).json()))
        found += list(_quotes_in(http.get("/v1/deals", params={"limit": 500}).json()))
        attacker = Trader(
            key=world.attacker.key,
            chain_id=world.st.escrow.domain.chain_id,
            escrow=world.st.escrow.address,
        )
        own = attacker.quote(slo_ms=SLO_MS, valid_until=world.st.anvil.latest_timestamp() + 600)
        own = Quote.from_json({**own.to_json(), "client": world.victim.address})
        found.append((own.to_json(), attacker.signed(own)["quote_signature"]))
        accepted = 0
        for quote, signature in found:
            body = {"quote": quote, "quote_signature": signature}
            reply = http.post(path + "/quote", json=body)
            tally.judge(reply, "quote attach", [], write=quote != before)
            accepted += reply.status_code < 300
        after = http.get(path).json()["quote"]
    ask_terms = _terms(world.ask_terms.to_json())
    changed = int(_terms(after) != _terms(before) or _terms(after) != ask_terms)
    tally.terms_changed += changed
    return {"quotes_tried": len(found), "accepted": accepted, "terms_changed": changed}


# ---- 3. nested JSON -------------------------------------------------------------------------


def nested(world: World, tally: Tally, quick: bool) -> dict[str, Any]:
    """``[`` x 100,000 to every JSON route of both services (and in the task request header)."""
    body = b"[" * 100_000
    statuses: dict[str, int] = {}
    with client(world.market, "127.0.0.4") as market, client(world.daemon, "127.0.0.4") as daemon:
        for path in (
            "/v1/orders",
            "/v1/orders/batch",
            "/v1/orders/cancel",
            "/v1/providers/heartbeat",
            f"/v1/deals/{world.market_deal}/quote",
        ):
            reply = market.post(path, content=body, headers=JSON)
            tally.judge(reply, f"nested {path}", [])
            statuses[f"market {path}"] = reply.status_code
        reply = daemon.post("/v1/vouchers", content=body, headers=JSON)
        tally.judge(reply, "nested /v1/vouchers", [])
        statuses["daemon /v1/vouchers"] = reply.status_code
        assert world.victim.task is not None
        headers = world.task_headers(world.victim.task, ZERO)
        headers["X-Tpumarket-Request"] = "[" * 30_000
        reply = daemon.post("/v1/tasks", content=world.envelope, headers=headers)
        tally.judge(reply, "nested request header", [])
        statuses["daemon request header"] = reply.status_code
    return {"statuses": statuses}


# ---- 4. a batch of 60,000 invalid orders ----------------------------------------------------


def big_batch(world: World, tally: Tally, quick: bool) -> dict[str, Any]:
    """A 1 MiB batch of 60,000 ``{"side":"bid"}``, several times."""
    body = json.dumps({"orders": [{"side": "bid"}] * 60_000}).encode()
    times, sizes, statuses = [], [], set()
    with client(world.market, "127.0.0.5") as http:
        for _ in range(3 if quick else 10):
            reply, ms = _timed(lambda: http.post("/v1/orders/batch", content=body, headers=JSON))
            tally.judge(reply, "batch of 60,000", [])
            times.append(round(ms, 1))
            sizes.append(len(reply.content))
            statuses.add(reply.status_code)
    return {"statuses": sorted(statuses), "max_ms": max(times), "max_answer_bytes": max(sizes)}


# ---- 5. uploads -----------------------------------------------------------------------------


def _head_answer(port: int, head: bytes) -> str:
    """Send a request's head only (its body declared, never sent); return the status line."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(head)
        answer = sock.recv(4_096)
    return answer.split(b"\r\n", 1)[0].decode(errors="replace")


def uploads(world: World, tally: Tally, quick: bool) -> dict[str, Any]:
    """200 MiB declared or streamed as a stranger's task and as a voucher; the largest signed
    voucher bitmap, from the deal's client and from a stranger."""
    assert world.victim.task is not None
    mib = 20 if quick else 200
    port = int(world.daemon.rsplit(":", 1)[1])
    headers = world.task_headers(world.victim.task, ZERO)
    lines = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    task_head = f"POST /v1/tasks HTTP/1.1\r\nhost: d\r\n{lines}content-length: {mib << 20}\r\n\r\n"
    voucher_head = (
        "POST /v1/vouchers HTTP/1.1\r\nhost: d\r\ncontent-type: application/json\r\n"
        f"content-length: {mib << 20}\r\n\r\n"
    )
    figures: dict[str, Any] = {
        "task_declared": _head_answer(port, task_head.encode()),
        "voucher_declared": _head_answer(port, voucher_head.encode()),
    }

    def stream() -> Iterator[bytes]:
        for _ in range(mib * 16):
            yield b" " * 65_536

    with client(world.daemon, "127.0.0.6") as http:
        try:
            reply = http.post("/v1/vouchers", content=stream(), headers=JSON)
            figures["voucher_streamed"] = reply.status_code
            tally.judge(reply, "voucher streamed", [])
        except httpx.HTTPError as exc:  # the daemon answered 413 and closed mid-upload
            figures["voucher_streamed"] = type(exc).__name__
        domain = world.st.escrow.domain
        victim = world.victim
        voucher = Voucher(
            deal_id=victim.deal_id, cumulative_amount=10**6, tasks=(2**256 - 1,) * 256
        )
        for who, key in (("client", victim.key), ("stranger", world.attacker.key)):
            body = {
                "voucher": voucher.to_json(),
                "signature": "0x" + voucher.sign(domain, key).hex(),
            }
            reply, ms = _timed(partial(http.post, "/v1/vouchers", json=body))
            tally.judge(reply, f"largest voucher by {who}", [], write=who == "stranger")
            figures[f"largest_voucher_{who}"] = [reply.status_code, round(ms, 1)]
    return figures


# ---- 6. floods ------------------------------------------------------------------------------


def floods(world: World, tally: Tally, quick: bool) -> dict[str, Any]:
    """Orders and asks of an unfunded key, adverts of unstaked keys with invented classes, a
    funded key's orders beyond its funds; spread over many source addresses."""
    chain_id, escrow = world.st.escrow.domain.chain_id, world.st.escrow.address
    now = world.st.anvil.latest_timestamp()
    count = 20 if quick else 400
    sources = [f"127.0.2.{n}" for n in range(1, 21)]
    pools = [client(world.market, s) for s in sources]
    fields: dict[str, Any] = {"device_class": DEVICE_CLASS, "plan": "flat", "slo_ms": SLO_MS}
    fields["memory"] = 0
    figures: dict[str, Any] = {}
    try:
        broke = Trader(chain_id=chain_id, escrow=escrow)
        accepted = 0
        for n in range(count):
            order = broke.bid(now, price=1_000, quantity=1, **fields)
            reply = pools[n % len(pools)].post("/v1/orders", json=order)
            tally.judge(reply, "unfunded bid", [], write=True)
            accepted += reply.status_code < 300
        figures["unfunded_bids_accepted"] = accepted
        accepted = 0
        for n in range(count // 4):
            order = broke.ask(now, price=10**9, quantity=1, **fields)
            reply = pools[n % len(pools)].post("/v1/orders", json=order)
            tally.judge(reply, "unstaked ask", [], write=True)
            accepted += reply.status_code < 300
        figures["unstaked_asks_accepted"] = accepted
        accepted = 0
        for n in range(count // 4):
            advert = Trader(chain_id=chain_id, escrow=escrow).heartbeat(
                int(time.time()), device_class=f"invented-{n}"
            )
            reply = pools[n % len(pools)].post("/v1/providers/heartbeat", json=advert)
            tally.judge(reply, "unstaked advert", [], write=True)
            accepted += reply.status_code < 300
        figures["unstaked_adverts_accepted"] = accepted
        classes = pools[0].get("/v1/classes").json()
        providers = pools[0].get("/v1/providers").json()
        figures["invented_classes_listed"] = sum("invented" in c for c in classes)
        figures["providers_listed"] = len(providers)
        funded = Trader(key=world.attacker.key, chain_id=chain_id, escrow=escrow)
        free = world.st.escrow.balance_of(world.attacker.address)
        each = 1_000 * 1_000  # price x quantity of each bid: below every ask, so none trades
        accepted, limited = 0, 0
        for n in range(count):
            order = funded.bid(now, price=1_000, quantity=1_000, **fields)
            reply = pools[n % len(pools)].post("/v1/orders", json=order)
            tally.calls += 1
            accepted += reply.status_code < 300
            limited += reply.status_code == 429
        figures["funded_bids_accepted"] = accepted
        figures["funded_bids_allowed_by_funds"] = free // each
        figures["funded_bids_rate_limited"] = limited
        beyond = max(0, accepted - free // each)
        tally.unauthorized_writes += beyond
        figures["orders_beyond_funds"] = beyond
        reply, ms = _timed(lambda: pools[0].get("/v1/overview"))
        figures["overview_ms_after_floods"] = round(ms, 1)
    finally:
        for pool in pools:
            pool.close()
    return figures


# ---- 7. the smaller ones --------------------------------------------------------------------


def _slow_connections(port: int, count: int, limit_s: float) -> tuple[int, float]:
    """Open ``count`` connections that send half a request line; return how many the server
    cut within ``limit_s`` and when the last was cut."""
    socks = [socket.create_connection(("127.0.0.1", port)) for _ in range(count)]
    started = time.monotonic()
    try:
        for sock in socks:
            sock.sendall(b"GET /v1/health HTTP/1.1\r\n")
            sock.settimeout(limit_s)

        def cut(sock: socket.socket) -> bool:
            with contextlib.suppress(OSError):
                while sock.recv(4_096):
                    pass
                return True
            return False

        with ThreadPoolExecutor(max_workers=16) as pool:
            closed = sum(pool.map(cut, socks))
    finally:
        for sock in socks:
            sock.close()
    return closed, time.monotonic() - started


def smaller(world: World, tally: Tally, quick: bool) -> dict[str, Any]:
    """Unauthenticated deal summary, used vs unused index, out-of-range numbers, headers,
    content types, a bad compile target, slow connections."""
    victim, attacker = world.victim, world.attacker
    domain = world.st.escrow.domain
    figures: dict[str, Any] = {}
    with client(world.daemon, "127.0.0.7") as daemon, client(world.market, "127.0.0.7") as market:
        reply = daemon.get(f"/v1/deals/{victim.deal_id}")
        tally.judge(reply, "deal summary unauthenticated", victim.secrets(), party_only=True)
        figures["deal_summary_unauthenticated"] = reply.status_code
        answers = []
        for index in (0, 999):
            request = world.sign_task(victim, index=index)
            headers = world.task_headers(request, request.sign(domain, attacker.key))
            reply = daemon.post("/v1/tasks", content=world.envelope, headers=headers)
            tally.judge(reply, f"index {index} as non-client", victim.secrets(), party_only=True)
            answers.append((reply.status_code, reply.json().get("error")))
        figures["used_and_unused_index_alike"] = answers[0] == answers[1]
        out_of_range = [
            daemon.get(f"/v1/tasks/{2**300}/0"),
            daemon.get(f"/v1/tasks/{victim.deal_id}/{2**40}"),
            daemon.get(f"/v1/deals/{'9' * 5000}"),
            daemon.get(f"/v1/tasks/{victim.deal_id}/0", params={"wait": "nan"}),
            market.get("/v1/history/cpu", params={"since": str(10**30)}),
            market.get("/v1/book/cpu", params={"levels": "9" * 5000}),
            market.get("/v1/fills", params={"limit": "-5"}),
        ]
        for reply in out_of_range:
            tally.judge(reply, "out of range", victim.secrets())
        figures["out_of_range_statuses"] = sorted({r.status_code for r in out_of_range})
        page, docs = market.get("/"), market.get("/docs")
        csp = page.headers.get("content-security-policy", "")
        figures["web_csp_without_external_sources"] = bool(csp) and "http" not in csp
        figures["docs_without_cdn"] = "cdn" not in docs.text.lower() and "https://" not in docs.text
        reply = market.post("/v1/orders", content=b"{}", headers={"content-type": "text/plain"})
        figures["order_as_text_plain"] = reply.status_code
        request = world.sign_task(victim)
        headers = world.task_headers(request, request.sign(domain, victim.key))
        headers["X-Tpumarket-Target"] = "v5e 1x1"
        reply = daemon.post("/v1/tasks", content=world.envelope, headers=headers)
        figures["bad_compile_target"] = reply.status_code
    if quick:  # tests/market/test_hostile_http.py and tests/provider/test_daemon_connections.py
        return figures
    count = 100
    services = {"market": world.market, "daemon": world.daemon}
    with ThreadPoolExecutor(max_workers=2) as both:  # both services dripped on at once
        cuts = both.map(
            lambda url: _slow_connections(int(url.rsplit(":", 1)[1]), count, 40.0),
            services.values(),
        )
        for name, (closed, seconds) in zip(services, cuts, strict=True):
            figures[f"{name}_slow_connections_cut"] = f"{closed}/{count} in {seconds:.1f} s"
            tally.calls += count
            tally.slow_connections_left += count - closed
            if closed < count:
                tally.leaks.append(f"{name}: {count - closed} slow connections still open")
    return figures


ATTACKS: list[tuple[str, Callable[[World, Tally, bool], dict[str, Any]]]] = [
    ("1_replayed_requests", replay),
    ("2_quote_swap", quote_swap),
    ("3_nested_json", nested),
    ("4_batch_60000", big_batch),
    ("5_uploads", uploads),
    ("6_floods", floods),
    ("7_smaller", smaller),
]
