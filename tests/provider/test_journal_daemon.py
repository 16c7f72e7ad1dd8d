"""A daemon on real anvil seals a deal once it closes, and still answers for it.

Tasks run in the daemon's sandbox, the voucher and the close go through the escrow; the
daemon's journal upkeep (its scheduled job, run here by hand) seals the deal; the API serves
the sealed deal from disk; a late voucher is refused; a reopened journal leaves the deal out
of memory and its background check finds it whole.
"""

from __future__ import annotations

from typing import Any

from fastapi.testclient import TestClient

from contracts.binding import DEAL_CLOSED
from contracts.messages import Voucher, address_of, task_bitmap
from provider.daemon import Daemon
from provider.journal import Journal
from tests.provider.access_support import deal_access, proof
from tests.provider.daemon_support import ChainWorld, sign_task, tiny_mlp_envelope


def voucher_body(world: ChainWorld, deal_id: int, amount: int, tasks: list[int]) -> dict[str, Any]:
    voucher = Voucher(deal_id=deal_id, cumulative_amount=amount, tasks=task_bitmap(tasks))
    return {
        "voucher": voucher.to_json(),
        "signature": "0x" + voucher.sign(world.domain, world.client).hex(),
    }


def test_daemon_when_a_deal_closes_then_it_is_sealed_and_still_served_from_disk(
    api: TestClient, chain_world: ChainWorld, daemon: Daemon
) -> None:
    world = chain_world
    deal_id = world.open_deal()
    envelope = tiny_mlp_envelope()[0]
    tasks = [sign_task(world, world.client, deal_id, i, envelope) for i in range(2)]
    done = [
        api.post("/v1/tasks", content=t.body, headers=t.headers(), params={"wait": 60}).json()
        for t in tasks
    ]
    assert [d["state"] for d in done] == ["succeeded", "succeeded"], done
    amount = sum(int(d["receipt"]["amount"]) for d in done)
    assert (
        api.post("/v1/vouchers", json=voucher_body(world, deal_id, amount, [0, 1])).status_code
        == 200
    )
    world.escrow.close_deal(world.client, deal_id)  # CloseAgreed by the client
    assert daemon.jobs.close_deals([deal_id]) == [deal_id]
    assert world.escrow.get_deal(deal_id).status == DEAL_CLOSED

    daemon._journal_upkeep()  # the scheduled job: seal, then check a batch of sealed deals

    assert daemon.journal.sealed(deal_id)
    assert deal_id not in [d for d, _ in daemon.journal.iter_books()]
    summary = api.get(f"/v1/deals/{deal_id}", headers=deal_access(world, deal_id)).json()
    assert summary["closed"] is True and summary["delivered"] == 2, summary
    again = api.get(f"/v1/tasks/{deal_id}/1", headers=proof(world, world.client, deal_id, 1))
    assert again.status_code == 200 and again.json()["receipt"] == done[1]["receipt"]
    repeat = api.post("/v1/tasks", content=tasks[0].body, headers=tasks[0].headers()).json()
    assert repeat["ack"] == done[0]["ack"]  # the same signed request gets its ack back
    late = api.post("/v1/vouchers", json=voucher_body(world, deal_id, amount + 1, [0, 1]))
    assert late.status_code == 409 and late.json()["error"] == "deal_not_open", late.text

    reopened = Journal(daemon.journal.path, address_of(world.provider), world.domain)
    try:
        assert deal_id not in [d for d, _ in reopened.iter_books()]
        report = reopened.verify_sealed_batch(limit=10_000)
        assert report.ok and report.sealed >= 1, report.problems
    finally:
        reopened.close()
