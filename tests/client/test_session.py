"""A client deal session against a real provider daemon over HTTP, on a real escrow.

The client pays exactly the verified deliveries; altered output bytes and a late delivery are
caught by verification and never paid; the late one is refunded on chain with the penalty.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest
import uvicorn

from client.accounts import ClientAccount
from client.provider_http import ProviderHttp, TaskView
from client.session import DealSession, TaskSpec
from client.vouchers import VoucherBook
from contracts.chain import free_port
from contracts.messages import KIND_COMPILE, KIND_INFERENCE, address_of
from provider.api import create_app
from provider.config import SettlementConfig
from provider.daemon import Daemon
from provider.sandbox import Sandbox
from tests.provider.daemon_support import (
    CHALLENGE_WINDOW,
    PLAN,
    ChainWorld,
    provider_config,
    spin_envelope,
    start_world,
    tiny_mlp_envelope,
)


@pytest.fixture(scope="module")
def chain_world() -> Iterator[ChainWorld]:
    world = start_world()
    try:
        yield world
    finally:
        world.anvil.stop()


@pytest.fixture(scope="module")
def provider(
    chain_world: ChainWorld, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, Daemon]]:
    sandbox = Sandbox(pool_size=1, cache_dir=tmp_path_factory.mktemp("cache"), jax_platforms="cpu")
    config = provider_config(
        chain_world,
        tmp_path_factory.mktemp("provider"),
        slo_ms=4_000,
        settlement=SettlementConfig(
            redeem_threshold=1, redeem_max_age_s=10**9, silent_after_s=10**9
        ),
    )
    daemon = Daemon(config, chain=chain_world.chain, sandbox=sandbox)
    daemon.start(schedule=False)
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(create_app(daemon), host="127.0.0.1", port=port, log_level="warning")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        while not server.started:
            threading.Event().wait(0.05)  # readiness of the server thread
        yield f"http://127.0.0.1:{port}", daemon
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        daemon.close()
        sandbox.close()


class AlteringProvider(ProviderHttp):
    """A provider connection that flips a byte of every delivered output of one task."""

    def __init__(self, base_url: str, task_index: int) -> None:
        super().__init__(base_url)
        self.task_index = task_index

    def fetch(self, deal_id: int, task_index: int, *, wait_s: float = 0) -> TaskView:
        view = super().fetch(deal_id, task_index, wait_s=wait_s)
        if task_index == self.task_index and view.outputs:
            flipped = bytes([view.outputs[-1] ^ 1])
            view = TaskView(**{**view.__dict__, "outputs": view.outputs[:-1] + flipped})
        return view


def _session(world: ChainWorld, provider: ProviderHttp, deal_id: int) -> DealSession:
    account = ClientAccount(world.escrow, world.token, world.client)
    return DealSession(
        provider=provider,
        account=account,
        domain=world.domain,
        deal_id=deal_id,
        plan=PLAN,
        provider_address=address_of(world.provider),
        book=VoucherBook(deal_id=deal_id, cap=10**8),
        challenge_window=CHALLENGE_WINDOW,
        spot_check_fraction=1.0,
    )


def test_session_pays_verified_work_and_refunds_what_was_late_or_wrong(
    chain_world: ChainWorld, provider: tuple[str, Daemon]
) -> None:
    world = chain_world
    provider_url, daemon = provider
    deal_id = world.open_deal()
    session = _session(world, AlteringProvider(provider_url, task_index=2), deal_id)
    mlp, _ = tiny_mlp_envelope()
    specs = [
        TaskSpec(KIND_INFERENCE, tiny_mlp_envelope(seed)[0], max_price=10_000) for seed in range(4)
    ]
    specs.append(TaskSpec(KIND_COMPILE, mlp, max_price=10_000, target="local"))
    outcomes = session.run(specs, concurrency=2, wait_s=60)

    assert [o.verified for o in outcomes] == [True, True, False, True, True]
    assert "output bytes" in (outcomes[2].rejected or "")
    assert all(o.spot_checked for o in outcomes if o.verified and o.spec.kind == KIND_INFERENCE)

    late = session.submit(TaskSpec(KIND_INFERENCE, spin_envelope(400_000_000), max_price=10_000))
    session.collect(late, wait_s=60)
    assert late.view is not None and late.view.receipt is not None
    assert not late.verified and "after the deadline" in (late.rejected or "")

    voucher = session.pay()
    assert voucher is not None
    assert voucher.cumulative_amount == 3 * PLAN.inference_price + PLAN.compile_price
    assert [voucher.covers(i) for i in range(6)] == [True, True, False, True, True, False]
    again = ProviderHttp(provider_url)
    assert again.send_voucher(voucher, voucher.sign(world.domain, world.client)) is False
    daemon.jobs.run_all()
    assert world.escrow.get_deal(deal_id).vouched == voucher.cumulative_amount
    assert world.escrow.balance_of(address_of(world.provider)) == voucher.cumulative_amount

    world.anvil.increase_time(CHALLENGE_WINDOW + 10)
    chain_now = world.now() + 1
    refunded = session.refund_breaches(chain_now)
    assert {o.index for o in refunded} == {2, 5}
    deal = world.escrow.get_deal(deal_id)
    assert deal.stake == 10**6 - 2 * 50_000
    refunds = sum(o.refunded[0] for o in refunded if o.refunded)
    assert deal.committed == voucher.cumulative_amount + refunds
