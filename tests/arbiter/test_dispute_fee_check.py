"""With an arbiter fee, the claim watcher checks the client's free escrow balance before it
disputes: short of the fee, it says what is missing and keeps the batch to dispute (the
transaction would revert), and disputes it once the fee is deposited (anvil, real escrow)."""

from __future__ import annotations

from pathlib import Path

from client.accounts import ClientAccount
from client.ledger import DealLedger
from client.ledger_records import TaskRecord, TaskState
from client.watch import ClaimWatcher
from contracts.binding import BATCH_DISPUTED, BATCH_PENDING
from tests.contracts.builders import claim, open_deal
from tests.contracts.conftest import World

from .drill import PENALTY, Job, signed_delivery

FEE = 20_000


def test_a_dispute_short_of_the_fee_says_what_is_missing_then_goes_once_deposited(
    world: World, job: Job, tmp_path: Path
) -> None:
    escrow, client, provider = world.escrow, world.clients[0], world.providers[0]
    escrow.set_arbiter_fee(world.arbiter, FEE)
    deal_id, _ = open_deal(world, client, provider, penalty=PENALTY)
    task = signed_delivery(world, deal_id, 0, job, job.outputs, client, provider)
    ledger = DealLedger.open(tmp_path, escrow.domain.chain_id, escrow.address, deal_id)
    ledger.put(
        TaskRecord(
            index=0,
            run=1,
            label="task 0",
            request=task.request,
            request_signature=task.request_sig,
            state=TaskState.UNDELIVERED,
            ack=task.ack,
            ack_signature=task.ack_sig,
        )
    )
    claim(world, provider, deal_id, [task])
    account = ClientAccount(escrow, world.token, client)
    free = escrow.balance_of(account.address)
    assert free < FEE
    said: list[str] = []
    watcher = ClaimWatcher(account, ledger, say=said.append)

    assert watcher.scan().disputed == ()
    assert escrow.get_batch(deal_id, 0).status == BATCH_PENDING
    assert ledger.batches[0].verdict == "to_dispute"
    line = " ".join(said)
    assert "arbiter's fee" in line and "deposit" in line, said

    escrow.deposit(client, FEE - free)
    assert watcher.scan().disputed == (0,)
    assert escrow.get_batch(deal_id, 0).status == BATCH_DISPUTED
