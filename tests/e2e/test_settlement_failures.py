"""What goes wrong, end to end: altered outputs, a provider killed mid-deal, a silent client.

One anvil serves the module (no market: deals open with the providers' signed quotes); each
test starts its own provider daemon by its CLI. The silent-client test moves the chain's
clock forward, so it runs last.
"""

from __future__ import annotations

import base64
import http.server
import json
import re
import threading
from collections.abc import Iterator

import httpx
import pytest

from client.accounts import ClientAccount
from client.models import ExportedModel
from client.provider_http import ProviderHttp
from client.session import DealSession
from client.tasks import TaskSpec
from client.vouchers import VoucherBook
from contracts.binding import BATCH_REJECTED, DEAL_CLOSED, TASK_CLAIMED, TASK_NONE, TASK_VOUCHED
from contracts.errors import ContractRevert
from contracts.messages import KIND_INFERENCE, Quote, address_of
from contracts.pricing import flat
from programs.envelope import ProgramEnvelope
from tests.e2e.stack import (
    MIN_WINDOW,
    PROVIDER_STAKE,
    SLOW_STEPS,
    UNIT,
    WINDOW,
    Provider,
    Stack,
    spin_model,
    stack,
    wait_until,
)

PLAN = flat(compile_price=3_000, inference_price=1_000)
PRICE = PLAN.inference_price
DEPOSIT = UNIT


@pytest.fixture(scope="module")
def st(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with stack(tmp_path_factory.mktemp("failures"), lean=True) as built:
        built.escrow.deposit(built.client, DEPOSIT)
        yield built


@pytest.fixture(scope="module")
def model() -> ExportedModel:
    return spin_model()


def envelope(model: ExportedModel, steps: int, seed: int) -> ProgramEnvelope:
    import numpy as np

    return model.envelope(np.array([steps], np.int32), np.full(4, float(seed), np.float32))


def open_session(
    st: Stack, provider: Provider, *, url: str | None = None, window: int = WINDOW
) -> tuple[DealSession, Quote]:
    quote = st.quote(provider, max_spend=50_000, window=window)
    deal_id = st.open_deal(quote, provider)
    session = DealSession(
        provider=ProviderHttp(url or provider.url, client_key=st.client),
        account=ClientAccount(st.escrow, st.token, st.client, min_challenge_window=MIN_WINDOW),
        domain=st.escrow.domain,
        deal_id=deal_id,
        plan=PLAN,
        provider_address=provider.address,
        book=VoucherBook(deal_id=deal_id, cap=quote.max_spend),
        challenge_window=quote.challenge_window,
    )
    return session, quote


# ---- wrong output ------------------------------------------------------------------------


class AlteringProxy(http.server.ThreadingHTTPServer):
    """An HTTP proxy to a daemon that flips one byte of the outputs of chosen tasks."""

    def __init__(self, upstream: str, tasks: set[int]) -> None:
        self.upstream = httpx.Client(base_url=upstream, timeout=120)
        self.tasks = tasks
        self.altered: list[int] = []
        super().__init__(("127.0.0.1", 0), _ProxyHandler)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _ProxyHandler(http.server.BaseHTTPRequestHandler):
    server: AlteringProxy

    def do_GET(self) -> None:
        self._forward()

    def do_POST(self) -> None:
        self._forward()

    def log_message(self, *_: object) -> None:
        pass

    def _forward(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else None
        headers = {
            k: v for k, v in self.headers.items() if k.lower().startswith(("x-", "content-"))
        }
        reply = self.server.upstream.request(self.command, self.path, content=body, headers=headers)
        content = reply.content
        task = re.match(r"^/v1/tasks/\d+/(\d+)(/outputs)?", self.path)
        if task and int(task.group(1)) in self.server.tasks and reply.status_code == 200:
            content = self._alter(content, raw=task.group(2) is not None, index=int(task.group(1)))
        self.send_response(reply.status_code)
        self.send_header("Content-Type", reply.headers.get("content-type", "application/json"))
        self.send_header("Content-Length", str(len(content)))
        self.end_headers()
        self.wfile.write(content)

    def _alter(self, content: bytes, *, raw: bool, index: int) -> bytes:
        if raw:
            self.server.altered.append(index)
            return bytes([content[0] ^ 1]) + content[1:]
        view = json.loads(content)
        if not view.get("outputs_b64"):
            return content
        outputs = bytearray(base64.b64decode(view["outputs_b64"]))
        outputs[-1] ^= 1
        view["outputs_b64"] = base64.b64encode(bytes(outputs)).decode()
        self.server.altered.append(index)
        return json.dumps(view).encode()


def test_altered_outputs_are_never_vouched_and_their_claim_is_disputed_and_refunded(
    st: Stack, model: ExportedModel
) -> None:
    provider = st.start_provider("honest", PLAN, slo_ms=2_000)
    proxy = AlteringProxy(provider.url, tasks={1})
    thread = threading.Thread(target=proxy.serve_forever, daemon=True)
    thread.start()
    try:
        session, quote = open_session(st, provider, url=proxy.url)
        specs = [TaskSpec(KIND_INFERENCE, envelope(model, 1_000, s), PRICE) for s in (1, 2)]
        outcomes = session.run(specs, concurrency=1, wait_s=30)
        voucher = session.pay()
    finally:
        proxy.shutdown()
        proxy.server_close()
    assert proxy.altered and set(proxy.altered) == {1}
    assert [o.verified for o in outcomes] == [True, False]
    assert outcomes[1].rejected == "output bytes do not match the receipt's output hash"
    assert voucher is not None and voucher.cumulative_amount == PRICE
    assert (voucher.covers(0), voucher.covers(1)) == (True, False)
    deal_id = session.deal_id
    wait_until(lambda: st.escrow.get_deal(deal_id).vouched == PRICE, 60, "voucher redeemed")
    assert st.escrow.task_status(deal_id, 1) == TASK_NONE
    assert st.escrow.balance_of(provider.address) == PRICE

    # The daemon delivered task 1 on time, so it claims it with the client's signed request
    # (by deadline + window / 2). The client, who never got bytes that verify, disputes the
    # claim inside its window; the arbiter rules for the client, who gets the claimed amount
    # back and the penalty, and the provider is paid only task 0.
    wait_until(lambda: st.escrow.get_deal(deal_id).pending == PRICE, 60, "task 1 claimed")
    assert st.escrow.task_status(deal_id, 1) == TASK_CLAIMED
    batch_id = st.escrow.get_deal(deal_id).batch_count - 1
    client = address_of(st.client)
    free = st.escrow.balance_of(client)
    session.account.dispute(deal_id, batch_id)
    resolved = st.escrow.resolve_dispute(st.arbiter, deal_id, batch_id, False)
    assert resolved.event("DisputeResolved").args["penalty"] == quote.penalty
    assert st.escrow.get_batch(deal_id, batch_id).status == BATCH_REJECTED
    assert st.escrow.balance_of(client) == free + PRICE + quote.penalty
    assert st.escrow.balance_of(provider.address) == PRICE
    assert st.escrow.get_deal(deal_id).pending == 0
    assert st.escrow_solvent()


# ---- provider killed mid-deal --------------------------------------------------------------


def test_provider_killed_mid_deal_and_restarted_loses_no_task_and_is_paid_once(
    st: Stack, model: ExportedModel
) -> None:
    provider = st.start_provider("crashy", PLAN)
    session, _ = open_session(st, provider)
    specs = [
        TaskSpec(KIND_INFERENCE, envelope(model, SLOW_STEPS, 1), PRICE),
        TaskSpec(KIND_INFERENCE, envelope(model, SLOW_STEPS, 2), PRICE),
        TaskSpec(KIND_INFERENCE, envelope(model, 1_000, 3), PRICE),
    ]
    outcomes = [session.submit(spec) for spec in specs]  # all acked, none delivered yet
    assert all(o.ack is not None for o in outcomes)
    provider.process.kill9()
    provider.restart()

    for outcome in outcomes:
        session.await_delivery(outcome, wait_s=30)
    assert [o.succeeded for o in outcomes] == [True, True, True]
    voucher = session.pay()
    assert voucher is not None and voucher.cumulative_amount == 3 * PRICE
    deal_id = session.deal_id
    wait_until(lambda: st.escrow.get_deal(deal_id).vouched == 3 * PRICE, 60, "voucher redeemed")

    # Killed again after redeeming: the restarted daemon pays itself nothing more.
    provider.process.kill9()
    provider.restart()
    replay = voucher.sign(st.escrow.domain, st.client)  # the redeemed voucher, once more
    with pytest.raises(ContractRevert):
        st.escrow.redeem_voucher(provider.key, voucher, replay)
    st.escrow.tx.reset_nonces()
    assert [st.escrow.task_status(deal_id, i) for i in range(4)] == [TASK_VOUCHED] * 3 + [TASK_NONE]
    assert st.escrow.balance_of(provider.address) == 3 * PRICE
    assert st.escrow.get_deal(deal_id).vouched == 3 * PRICE
    assert st.escrow_solvent()


# ---- silent client (last: it moves the chain's clock) ---------------------------------------


def test_silent_client_provider_claims_unvouched_receipts_and_is_paid_after_the_window(
    st: Stack, model: ExportedModel
) -> None:
    provider = st.start_provider("unpaid", PLAN, slo_ms=2_000)
    session, quote = open_session(st, provider)
    specs = [TaskSpec(KIND_INFERENCE, envelope(model, 1_000, s), PRICE) for s in (1, 2)]
    outcomes = session.run(specs, concurrency=2, wait_s=30)
    assert all(o.succeeded for o in outcomes)  # verified, but the client never signs a voucher
    deal_id = session.deal_id

    # The daemon claims them by settleBy - margin (deadline + window / 2), with the client's
    # signed requests; they pay out once the claim's own window has passed.
    wait_until(lambda: st.escrow.get_deal(deal_id).pending == 2 * PRICE, 60, "receipts claimed")
    assert st.escrow.balance_of(provider.address) == 0  # not before the challenge window
    claimed_at = st.anvil.latest_timestamp()
    st.anvil.increase_time(quote.challenge_window + 1)
    assert st.anvil.latest_timestamp() > claimed_at + quote.challenge_window
    wait_until(lambda: st.escrow.balance_of(provider.address) == 2 * PRICE, 60, "claim finalized")
    deal = st.escrow.get_deal(deal_id)
    assert (deal.pending, deal.committed) == (0, 2 * PRICE)

    client = address_of(st.client)
    free = st.escrow.balance_of(client)
    # The client agrees to close; the provider's settlement job closes the deal.
    ClientAccount(st.escrow, st.token, st.client).close(deal_id)
    wait_until(
        lambda: st.escrow.get_deal(deal_id).status == DEAL_CLOSED, 60, "deal closed by provider"
    )
    assert st.escrow.balance_of(client) == free + quote.max_spend - 2 * PRICE
    assert st.escrow.stake_of(provider.address) == PROVIDER_STAKE
    assert st.escrow_solvent()
