"""The client's claim watcher against a real escrow: a provider that claims what it did not
deliver, or more than it acked, is disputed inside the window; a dispute the arbiter leaves
lapses for the client with the refund and the penalty; an honest claim is accepted.

The provider here is an adversary acting on chain with what an honest client gave it (signed
requests); the client's side is its real ledger and watcher.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from client.accounts import ClientAccount
from client.cli import main
from client.ledger import DealLedger
from client.ledger_records import ChainState, TaskRecord, TaskState
from client.watch import ClaimWatcher, find_open_block
from contracts.binding import BATCH_DISPUTED, BATCH_PAID, BATCH_PENDING, BATCH_REJECTED
from contracts.chain import free_port, rpc
from tests.contracts.builders import SignedTask, claim, open_deal, signed_task
from tests.contracts.conftest import World

PENALTY = 50_000


def _ledger(world: World, tmp_path: Path, deal_id: int) -> DealLedger:
    escrow = world.escrow
    return DealLedger.open(tmp_path, escrow.domain.chain_id, escrow.address, deal_id)


def _record(task: SignedTask, state: TaskState) -> TaskRecord:
    """What the client's ledger holds for a task: requested, acked, and (if so) verified."""
    verified = state == TaskState.VERIFIED
    return TaskRecord(
        index=task.index,
        run=1,
        label=f"task {task.index}",
        request=task.request,
        request_signature=task.request_sig,
        state=state,
        ack=task.ack,
        ack_signature=task.ack_sig,
        receipt=task.receipt if verified else None,
    )


def _watcher(world: World, client: str, ledger: DealLedger) -> ClaimWatcher:
    return ClaimWatcher(ClientAccount(world.escrow, world.token, client), ledger)


def test_client_disputes_claim_of_undelivered_task(world: World, tmp_path: Path) -> None:
    client, provider = world.clients[0], world.providers[0]
    deal_id, _ = open_deal(world, client, provider)
    delivered = signed_task(world, deal_id, 0, client, provider)
    undelivered = signed_task(world, deal_id, 1, client, provider)
    ledger = _ledger(world, tmp_path, deal_id)
    ledger.put(_record(delivered, TaskState.VERIFIED))
    ledger.put(_record(undelivered, TaskState.UNDELIVERED))
    # The provider claims the task it never delivered, with the client's signed request.
    claim(world, provider, deal_id, [undelivered])
    report = _watcher(world, client, ledger).scan()
    assert (report.batches_seen, report.disputed, report.accepted) == (1, (0,), ())
    assert world.escrow.get_batch(deal_id, 0).status == BATCH_DISPUTED
    [batch] = ledger.batches.values()
    assert batch.verdict == "disputed" and "task 1 was not delivered" in batch.reason
    assert ledger.tasks[1].chain == ChainState.CLAIMED and ledger.tasks[1].batch == 0
    ledger.close()
    again = _ledger(world, tmp_path, deal_id)  # the verdict is on disk; nothing is judged twice
    assert again.batches[0].verdict == "disputed"
    assert _watcher(world, client, again).scan().batches_seen == 0


def test_client_disputes_claim_priced_above_the_acked_price(world: World, tmp_path: Path) -> None:
    client, provider = world.clients[0], world.providers[0]
    deal_id, _ = open_deal(world, client, provider)
    # Metered plan: the provider acked 100, then claims the plan's price of a longer run.
    task = signed_task(world, deal_id, 0, client, provider, ack_price=100, device_ms=4_000)
    assert task.receipt.amount > 100
    ledger = _ledger(world, tmp_path, deal_id)
    ledger.put(_record(task, TaskState.VERIFIED))
    claim(world, provider, deal_id, [task])
    report = _watcher(world, client, ledger).scan()
    assert report.disputed == (0,)
    assert "above its tasks' acked prices 100" in ledger.batches[0].reason


def test_client_accepts_claim_of_verified_work_and_the_provider_is_paid(
    world: World, tmp_path: Path
) -> None:
    client, provider = world.clients[0], world.providers[0]
    deal_id, _ = open_deal(world, client, provider)
    tasks = [signed_task(world, deal_id, i, client, provider) for i in range(2)]
    ledger = _ledger(world, tmp_path, deal_id)
    for task in tasks:
        ledger.put(_record(task, TaskState.VERIFIED))
    claim(world, provider, deal_id, tasks)
    report = _watcher(world, client, ledger).scan()
    assert (report.accepted, report.disputed) == ((0,), ())
    assert world.escrow.get_batch(deal_id, 0).status == BATCH_PENDING
    world.anvil.increase_time(world.escrow.get_deal(deal_id).challenge_window + 1)
    world.escrow.finalize_claim(provider, deal_id, 0)
    assert world.escrow.balance_of(world.addr(provider)) == sum(t.receipt.amount for t in tasks)


def test_dispute_left_by_the_arbiter_lapses_for_the_client_with_refund_and_penalty(
    world: World, tmp_path: Path
) -> None:
    client, provider = world.clients[0], world.providers[0]
    deal_id, _ = open_deal(world, client, provider, penalty=PENALTY)
    tasks = [signed_task(world, deal_id, i, client, provider) for i in range(2)]
    ledger = _ledger(world, tmp_path, deal_id)
    for task in tasks:
        ledger.put(_record(task, TaskState.UNDELIVERED))
    claim(world, provider, deal_id, tasks)
    watcher = _watcher(world, client, ledger)
    assert watcher.scan().disputed == (0,)
    before = world.escrow.balance_of(world.addr(client))
    world.anvil.increase_time(world.escrow.arbitration_period() + 1)
    report = watcher.scan()
    assert (report.lapsed, report.won) == ((0,), (0,))
    assert world.escrow.get_batch(deal_id, 0).status == BATCH_REJECTED
    amount = sum(t.receipt.amount for t in tasks)
    assert world.escrow.balance_of(world.addr(client)) == before + amount + 2 * PENALTY
    assert ledger.batches[0].outcome == "client_won"


def test_arbiter_ruling_for_the_provider_is_recorded_as_lost(world: World, tmp_path: Path) -> None:
    client, provider = world.clients[0], world.providers[0]
    deal_id, _ = open_deal(world, client, provider)
    task = signed_task(world, deal_id, 0, client, provider)
    ledger = _ledger(world, tmp_path, deal_id)
    ledger.put(_record(task, TaskState.REJECTED))
    claim(world, provider, deal_id, [task])
    watcher = _watcher(world, client, ledger)
    assert watcher.scan().disputed == (0,)
    world.escrow.resolve_dispute(world.arbiter, deal_id, 0, True)
    report = watcher.scan()
    assert (report.lost, report.lapsed) == ((0,), ())
    assert world.escrow.get_batch(deal_id, 0).status == BATCH_PAID
    assert ledger.batches[0].outcome == "provider_won"


def test_a_claim_seen_after_its_window_closed_is_recorded_as_missed(
    world: World, tmp_path: Path
) -> None:
    client, provider = world.clients[0], world.providers[0]
    deal_id, _ = open_deal(world, client, provider)
    task = signed_task(world, deal_id, 0, client, provider)
    ledger = _ledger(world, tmp_path, deal_id)
    ledger.put(_record(task, TaskState.UNDELIVERED))
    claim(world, provider, deal_id, [task])
    world.anvil.increase_time(world.escrow.get_deal(deal_id).challenge_window + 1)
    report = _watcher(world, client, ledger).scan()
    assert (report.missed, report.disputed) == ((0,), ())
    assert ledger.batches[0].verdict == "missed"


def test_watcher_finds_the_deal_s_open_block_by_a_bounded_backward_scan_and_keeps_it(
    world: World, tmp_path: Path
) -> None:
    client, provider = world.clients[0], world.providers[0]
    deal_id, _ = open_deal(world, client, provider)
    opened = int(world.chain.w3.eth.block_number)
    rpc(world.anvil.url, "anvil_mine", [hex(120)])
    block, args = find_open_block(world.escrow, deal_id, lowest=opened - 5, chunk=25)
    assert (block, int(args["dealId"])) == (opened, deal_id)
    ledger = _ledger(world, tmp_path, deal_id)
    assert ledger.open_block is None
    assert _watcher(world, client, ledger).scan().to_block == opened + 120
    assert (ledger.open_block, ledger.scanned_block) == (opened, opened + 120)


def test_job_watch_disputes_from_the_ledger_alone_when_the_provider_is_gone(
    world: World, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    client, provider = world.clients[0], world.providers[0]
    deal_id, _ = open_deal(world, client, provider)
    task = signed_task(world, deal_id, 0, client, provider)
    ledger = _ledger(world, tmp_path, deal_id)
    ledger.put(_record(task, TaskState.ACKED))  # the run crashed waiting for it
    ledger.close()
    claim(world, provider, deal_id, [task])
    argv = ["job", "watch", "--deal", str(deal_id), "--rpc-url", world.anvil.url]
    argv += ["--escrow", world.escrow.address, "--key", client, "--state-dir", str(tmp_path)]
    argv += ["--provider-url", f"http://127.0.0.1:{free_port()}", "--json"]
    assert main(argv) == 0
    captured = capsys.readouterr()
    assert "claims are judged from the ledger alone" in captured.err
    report = json.loads(captured.out.strip().splitlines()[-1])
    assert (report["batches_seen"], report["disputed"]) == (1, [0])
    assert world.escrow.get_batch(deal_id, 0).status == BATCH_DISPUTED
    assert main(argv) == 0  # a second look finds nothing new and judges nothing twice
    again = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert (again["batches_seen"], again["disputed"]) == (0, [])
    status = ["job", "status", "--deal", str(deal_id), "--rpc-url", world.anvil.url]
    status += ["--escrow", world.escrow.address, "--key", client, "--state-dir", str(tmp_path)]
    assert main(status) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0].split()[:6] == ["task", "run", "what", "state", "on", "chain"]
    assert table[1].split()[:5] == ["0", "1", "task", "0", "acked"]
    assert table[1].split()[5:7] == ["claimed", "0"] and table[1].endswith("claim disputed")
    assert any(line.split()[-2:] == ["disputed", "-"] for line in table)  # the batches table
