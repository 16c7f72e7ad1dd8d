"""Refunds and vouchers from the client's ledger, against a real escrow.

The client's last run crashed with tasks acked; its provider is gone. A refund waits for the
task's settlement instant on chain, presents the request with the ack, and a refund that finds
the task already settled (the provider claimed it) is written to the ledger at once. Before a
voucher is signed the ledger is reconciled with the chain: a task the provider claimed is
never covered again.
"""

from __future__ import annotations

from pathlib import Path

from client.accounts import ClientAccount
from client.jobs import JobRunner
from client.ledger import DealLedger
from client.ledger_records import ChainState, TaskRecord, TaskState
from client.provider_http import ProviderHttp
from client.session import DealSession
from client.tasks import settle_by
from client.vouchers import VoucherBook
from contracts.binding import TASK_REFUNDED
from contracts.chain import free_port
from contracts.messages import Voucher, address_of, task_bitmap
from tests.contracts.builders import DEFAULT_PLAN, SignedTask, claim, open_deal, signed_task
from tests.contracts.conftest import World

PENALTY = 50_000


def _record(task: SignedTask, state: TaskState) -> TaskRecord:
    return TaskRecord(
        index=task.index,
        run=1,
        label=f"task {task.index}",
        request=task.request,
        request_signature=task.request_sig,
        state=state,
        ack=task.ack,
        ack_signature=task.ack_sig,
        receipt=task.receipt if state == TaskState.VERIFIED else None,
    )


def _runner(world: World, tmp_path: Path, client: str, provider: str, deal_id: int) -> JobRunner:
    """The client's runner on a deal whose provider no longer answers (a closed port)."""
    deal = world.escrow.get_deal(deal_id)
    ledger = DealLedger.open(tmp_path, world.escrow.domain.chain_id, world.escrow.address, deal_id)
    session = DealSession(
        provider=ProviderHttp(f"http://127.0.0.1:{free_port()}", retries=1),
        account=ClientAccount(world.escrow, world.token, client),
        domain=world.escrow.domain,
        deal_id=deal_id,
        plan=DEFAULT_PLAN,
        provider_address=address_of(provider),
        book=VoucherBook(deal_id=deal_id, cap=deal.max_spend),
        challenge_window=deal.challenge_window,
        slo_ms=2_000,
        expiry=deal.expiry,
    )
    return JobRunner.resume(session, ledger)


def test_refund_of_a_crashed_runs_task_waits_for_its_settlement_instant_then_pays_the_penalty(
    world: World, tmp_path: Path
) -> None:
    client, provider = world.clients[0], world.providers[0]
    deal_id, _ = open_deal(world, client, provider, penalty=PENALTY)
    task = signed_task(world, deal_id, 0, client, provider)
    ledger = DealLedger.open(tmp_path, world.escrow.domain.chain_id, world.escrow.address, deal_id)
    ledger.put(_record(task, TaskState.ACKED))  # the run was killed waiting for the result
    ledger.close()

    runner = _runner(world, tmp_path, client, provider, deal_id)
    deal = world.escrow.get_deal(deal_id)
    instant = settle_by(task.request.deadline, deal.expiry, deal.challenge_window)
    assert runner.next_refund_at() == instant + 1
    assert runner.refund_due(instant) == []  # the chain refuses before: the task stays pending
    assert set(runner.ledger.pending) == {0}
    world.anvil.increase_time(instant + 1 - world.now())
    assert runner.refund_due(world.now() + 1) == [(0, task.ack.price, PENALTY)]
    assert world.escrow.task_status(deal_id, 0) == TASK_REFUNDED
    runner.ledger.close()
    again = DealLedger.open(tmp_path, world.escrow.domain.chain_id, world.escrow.address, deal_id)
    assert (again.tasks[0].chain, again.tasks[0].refund) == (
        ChainState.REFUNDED,
        (task.ack.price, PENALTY),
    )
    assert again.pending == {}


def test_job_refund_saves_the_ledger_when_a_refund_finds_the_task_already_settled(
    world: World, tmp_path: Path
) -> None:
    client, provider = world.clients[0], world.providers[0]
    deal_id, _ = open_deal(world, client, provider)
    task = signed_task(world, deal_id, 0, client, provider)
    ledger = DealLedger.open(tmp_path, world.escrow.domain.chain_id, world.escrow.address, deal_id)
    ledger.put(_record(task, TaskState.UNDELIVERED))
    ledger.close()
    claim(world, provider, deal_id, [task])  # the provider claimed it before the client refunded
    deal = world.escrow.get_deal(deal_id)
    world.anvil.increase_time(
        settle_by(task.request.deadline, deal.expiry, deal.challenge_window) + 1 - world.now()
    )
    runner = _runner(world, tmp_path, client, provider, deal_id)
    assert runner.refund_due(world.now() + 1) == []
    runner.ledger.close()  # the process ends: what it learnt is on disk, not only in memory
    again = DealLedger.open(tmp_path, world.escrow.domain.chain_id, world.escrow.address, deal_id)
    assert again.tasks[0].chain == ChainState.CLAIMED
    assert again.pending == {}  # the next `job refund` does not try it again


def test_voucher_never_covers_a_task_the_provider_claimed_after_it_was_vouched(
    world: World, tmp_path: Path
) -> None:
    client, provider = world.clients[0], world.providers[0]
    deal_id, _ = open_deal(world, client, provider)
    tasks = [signed_task(world, deal_id, i, client, provider) for i in range(3)]
    ledger = DealLedger.open(tmp_path, world.escrow.domain.chain_id, world.escrow.address, deal_id)
    for task in tasks:
        ledger.put(_record(task, TaskState.VERIFIED))
    ledger.last_signed = sum(t.receipt.amount for t in tasks)  # signed, never handed over
    ledger.last_tasks = frozenset({0, 1, 2})
    ledger.voucher_delivered = False
    ledger.close()
    claim(world, provider, deal_id, [tasks[1]])  # the provider claimed one of them instead

    runner = _runner(world, tmp_path, client, provider, deal_id)
    assert runner.pay() is None  # the provider is gone: the hand-over fails, and is recorded
    assert "voucher not handed over" in (runner.voucher_error or "")
    paid = {0: tasks[0].receipt.amount, 2: tasks[2].receipt.amount}
    assert runner.ledger.last_tasks == {0, 2} and runner.ledger.last_signed == sum(paid.values())
    assert runner.ledger.tasks[1].chain == ChainState.CLAIMED
    # The voucher the next run hands over is redeemable: it newly covers no claimed task.
    voucher = Voucher(deal_id, runner.ledger.last_signed, task_bitmap(runner.ledger.last_tasks))
    world.escrow.redeem_voucher(provider, voucher, voucher.sign(world.escrow.domain, client))
    assert world.escrow.get_deal(deal_id).vouched == sum(paid.values())
