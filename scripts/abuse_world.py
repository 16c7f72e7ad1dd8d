"""The world of ``scripts/abuse``: a staked provider, clients with deals and results, a deal
matched through the market, and the normal client that keeps working during the attacks."""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any

import httpx

from contracts.access import ACCESS_EXPIRY_HEADER, ACCESS_SIGNATURE_HEADER, result_access_digest
from contracts.messages import (
    KIND_INFERENCE,
    ZERO_ADDRESS,
    Quote,
    TaskRequest,
    address_of,
    sign_digest,
)
from contracts.pricing import flat
from programs.envelope import encode_envelope, request_input_hash
from tests.e2e.stack import UNIT, Provider, Stack, bid, post_ask, spin_model
from tests.market.signing import Trader

PLAN = flat(compile_price=5_000, inference_price=1_000)
SLO_MS = 10_000
PRICE = 2_000  # per unit, of the market deal's ask and bid
DEPOSIT = 10 * UNIT
DEVICE_CLASS = "cpu"
QUOTE_VALID_S = 120
"""The daemon's per-fill quotes are valid this long (chain seconds; attack 14 waits them out)."""


@dataclass
class Client:
    """A client key with a deal on the provider and its delivered task."""

    key: str
    deal_id: int
    task: TaskRequest | None = None
    signature: bytes = b""
    answer: dict[str, Any] = field(default_factory=dict)
    next_index: int = 0

    @property
    def address(self) -> str:
        """Return the client's address."""
        return address_of(self.key)

    def secrets(self) -> list[str]:
        """Return strings only the deal's parties may ever see (from the task's answer)."""
        answer = self.answer
        found = [
            str(answer.get("access_token", "")),
            str(answer.get("ack_signature", "")).removeprefix("0x"),
            str(answer.get("receipt_signature", "")).removeprefix("0x"),
            str(answer.get("receipt_hash", "")).removeprefix("0x"),
        ]
        outputs = str(answer.get("outputs_b64") or "")
        return [s for s in found if len(s) >= 16] + ([outputs[:40]] if len(outputs) >= 40 else [])


@dataclass
class Normal:
    """What the normal client did during the attacks."""

    latencies_ms: list[float] = field(default_factory=list)
    by_kind: dict[str, list[float]] = field(default_factory=dict)
    by_phase: dict[str, list[float]] = field(default_factory=dict)
    phase: str = "alone"
    errors: list[str] = field(default_factory=list)
    orders_placed: int = 0
    tasks_acked: list[int] = field(default_factory=list)
    chain_clock: threading.Lock = field(default_factory=threading.Lock)
    """Held while a task is signed and sent (its deadline is read from the chain's clock), and
    by attack 14 while it moves that clock on, so no request is signed against the old time."""


@dataclass
class World:
    """The running stack and the parties of the abuse run."""

    st: Stack
    provider: Provider
    envelope: bytes
    program_hash: bytes
    input_hash: bytes
    victim: Client
    attacker: Client
    normal_party: Client
    market_deal: str
    ask_terms: Quote
    victim_bid: str
    normal: Normal = field(default_factory=Normal)

    @property
    def market(self) -> str:
        """Return the market's URL."""
        assert self.st.market_url is not None
        return self.st.market_url

    @property
    def daemon(self) -> str:
        """Return the daemon's URL."""
        return self.provider.url

    @property
    def market_pid(self) -> int:
        """Return the market process's PID."""
        popen = self.st.processes[0].popen
        assert popen is not None
        return popen.pid

    @property
    def daemon_pid(self) -> int:
        """Return the daemon process's PID."""
        popen = self.provider.process.popen
        assert popen is not None
        return popen.pid

    def alive(self) -> dict[str, bool]:
        """Return, per service, whether its process runs and answers its health check."""
        found = {}
        for name, pid, url in (
            ("market", self.market_pid, self.market + "/healthz"),
            ("daemon", self.daemon_pid, self.daemon + "/v1/health"),
        ):
            try:
                os.kill(pid, 0)
                found[name] = httpx.get(url, timeout=30).status_code == 200
            except (OSError, httpx.HTTPError):
                found[name] = False
        return found

    def sign_task(
        self, client: Client, deal_id: int | None = None, index: int | None = None
    ) -> TaskRequest:
        """Return a fresh task request of ``client`` (its deal, its next index)."""
        if index is None:
            index, client.next_index = client.next_index, client.next_index + 1
        return TaskRequest(
            deal_id=client.deal_id if deal_id is None else deal_id,
            task_index=index,
            kind=KIND_INFERENCE,
            program_hash=self.program_hash,
            input_hash=self.input_hash,
            max_price=PLAN.inference_price,
            # The daemon's clock runs on from the last block; anvil mines only on transactions.
            deadline=max(self.st.anvil.latest_timestamp(), int(time.time())) + 120,
        )

    def task_headers(self, request: TaskRequest, signature: bytes) -> dict[str, str]:
        """Return the headers of a task submission."""
        return {
            "X-Tpumarket-Request": json.dumps(request.to_json()),
            "X-Tpumarket-Signature": "0x" + signature.hex(),
            "Content-Type": "application/octet-stream",
        }

    def proof(self, key: str, deal_id: int, index: int) -> dict[str, str]:
        """Return result-access headers signed by ``key`` for (deal, index)."""
        expiry = int(time.time()) + 300
        digest = result_access_digest(self.st.escrow.domain, deal_id, index, expiry)
        return {
            ACCESS_EXPIRY_HEADER: str(expiry),
            ACCESS_SIGNATURE_HEADER: "0x" + sign_digest(digest, key).hex(),
        }

    def normal_delivered(self) -> int:
        """Return how many of the normal client's acked tasks the daemon has delivered."""
        delivered = 0
        party = self.normal_party
        with httpx.Client(base_url=self.daemon, timeout=60) as http:
            for index in self.normal.tasks_acked:
                reply = http.get(
                    f"/v1/tasks/{party.deal_id}/{index}",
                    params={"wait": 30},
                    headers=self.proof(party.key, party.deal_id, index),
                )
                delivered += reply.status_code == 200 and reply.json().get("receipt") is not None
        return delivered

    def close(self) -> None:
        """Nothing to release: the stack stops its processes."""


def _new_client(st: Stack, deposit: int) -> str:
    key = st.spare_keys.pop()
    st.token.mint(st.deployer, address_of(key), 100 * UNIT)
    st.token.approve(key, st.escrow.address, 2**256 - 1)
    st.escrow.deposit(key, deposit)
    return key


def _open_deal(st: Stack, provider: Provider, key: str) -> int:
    quote = st.quote(provider, max_spend=5 * UNIT, client=address_of(key))
    signature = quote.sign(st.escrow.domain, provider.key)
    result = st.escrow.open_deal(key, quote, signature, quote.max_spend)
    return int(result.event("DealOpened").args["dealId"])


def deliver(world: World, client: Client) -> None:
    """Run one task of ``client`` to delivery; keep its request, signature and answer."""
    request = world.sign_task(client)
    signature = request.sign(world.st.escrow.domain, client.key)
    reply = httpx.post(
        world.daemon + "/v1/tasks",
        content=world.envelope,
        headers=world.task_headers(request, signature),
        params={"wait": 60},
        timeout=120,
    )
    if reply.status_code != 200 or reply.json().get("receipt") is None:
        raise SystemExit(f"set-up task not delivered: {reply.status_code} {reply.text[:300]}")
    client.task, client.signature, client.answer = request, signature, reply.json()


def build_world(st: Stack, say: Callable[[str], None]) -> World:
    """Start the provider, open the deals, deliver a task each, match a deal on the market."""
    provider = st.start_provider(
        "p1", PLAN, slo_ms=SLO_MS, settlement={"quote_valid_s": QUOTE_VALID_S}, wait=False
    )
    model = spin_model()  # exported while the daemon starts
    envelope = model.example_envelope()
    provider.ready()
    say(f"provider {provider.address} staked and serving at {provider.url}")
    st.escrow.deposit(st.client, DEPOSIT)
    victim = Client(st.client, _open_deal(st, provider, st.client))
    attacker_key = _new_client(st, DEPOSIT)
    attacker = Client(attacker_key, _open_deal(st, provider, attacker_key))
    normal_key = _new_client(st, DEPOSIT)
    normal = Client(normal_key, _open_deal(st, provider, normal_key))
    world = World(
        st=st,
        provider=provider,
        envelope=encode_envelope(envelope),
        program_hash=envelope.program_sha256,
        input_hash=request_input_hash(KIND_INFERENCE, envelope),
        victim=victim,
        attacker=attacker,
        normal_party=normal,
        market_deal="",
        ask_terms=st.quote(provider, max_spend=0, client=ZERO_ADDRESS),
        victim_bid="",
    )
    deliver(world, victim)
    deliver(world, attacker)
    say(f"deals {victim.deal_id} (victim), {attacker.deal_id} (attacker) delivered a task each")
    terms = st.quote(provider, max_spend=PRICE * 10, penalty=77_777, client=ZERO_ADDRESS)
    terms = replace(terms, stake=UNIT)
    post_ask(st, provider, terms, price=PRICE, quantity=10)
    world.ask_terms = terms
    world.victim_bid, records = bid(st, price=PRICE, quantity=10, plan="flat", slo_ms=SLO_MS)
    world.market_deal = str(records[0]["deal_id"])
    deadline = time.monotonic() + 60
    while _deal(world).get("quote") is None:  # the daemon attaches its quote for the fill
        if time.monotonic() > deadline:
            raise SystemExit("the daemon attached no quote to the market deal within 60 s")
        time.sleep(0.5)
    cheap = st.quote(provider, max_spend=PRICE, penalty=1, client=ZERO_ADDRESS)
    post_ask(st, provider, replace(cheap, stake=1), price=PRICE * 50, quantity=1)
    say(f"market deal {world.market_deal} matched, quote attached; a cheaper ask rests")
    return world


def _deal(world: World) -> dict[str, Any]:
    reply = httpx.get(f"{world.market}/v1/deals/{world.market_deal}", timeout=30)
    body: dict[str, Any] = reply.json()
    return body


def normal_client(world: World, stop: threading.Event) -> None:
    """Place and cancel a bid, submit a task; again every 100 ms until ``stop``."""
    normal, party = world.normal, world.normal_party
    trader = Trader(
        key=party.key, chain_id=world.st.escrow.domain.chain_id, escrow=world.st.escrow.address
    )
    fields = {"device_class": DEVICE_CLASS, "price": 1, "quantity": 1, "plan": "flat"}
    fields |= {"slo_ms": SLO_MS, "memory": 0}
    with (
        httpx.Client(base_url=world.market, timeout=30) as market,
        httpx.Client(base_url=world.daemon, timeout=30) as daemon,
    ):

        def timed(call: Callable[[], httpx.Response], what: str) -> httpx.Response | None:
            started = time.perf_counter()
            try:
                reply = call()
            except httpx.HTTPError as exc:
                normal.errors.append(f"{what}: {exc!r}"[:200])
                return None
            ms = (time.perf_counter() - started) * 1000
            normal.latencies_ms.append(ms)
            normal.by_kind.setdefault(what, []).append(ms)
            normal.by_phase.setdefault(normal.phase, []).append(ms)
            if reply.status_code >= 300:
                normal.errors.append(f"{what}: {reply.status_code} {reply.text[:120]}")
            return reply

        turn = 0
        while not stop.is_set():
            turn += 1
            now = int(time.time())  # the market's clock (the chain's moves only with blocks)
            order = trader.bid(now, **fields)
            placed = timed(partial(market.post, "/v1/orders", json=order), "order")
            if placed is not None and placed.status_code == 201:
                normal.orders_placed += 1
                order_id = placed.json()["order"]["order_id"]
                cancel = trader.cancel(order_id, now)
                timed(partial(market.post, "/v1/orders/cancel", json=cancel), "cancel")
            if turn % 3 == 0:
                with normal.chain_clock:
                    request = world.sign_task(party)
                    signature = request.sign(world.st.escrow.domain, party.key)
                    headers = world.task_headers(request, signature)
                    acked = timed(
                        partial(daemon.post, "/v1/tasks", content=world.envelope, headers=headers),
                        "task",
                    )
                if acked is not None and acked.status_code == 200:
                    normal.tasks_acked.append(request.task_index)
            stop.wait(0.1)  # the normal client's own pace
