"""Settlement jobs on real anvil: lost claims reconciled, deals (empty ones too) closed."""

from __future__ import annotations

from typing import Any

from fastapi.testclient import TestClient

from contracts.binding import DEAL_CLOSED, TASK_REFUNDED
from contracts.messages import Ack, Claim, Receipt, Voucher, address_of, task_bitmap
from provider.daemon import Daemon
from provider.receipts import settle_by
from tests.provider.access_support import deal_access
from tests.provider.daemon_support import (
    CHALLENGE_WINDOW,
    ChainWorld,
    sign_task,
    spin_envelope,
    tiny_mlp_envelope,
    wait_until,
)

SLOW_STEPS = 400_000_000  # several seconds: the close lands while it runs


def run_tasks(
    api: TestClient,
    world: ChainWorld,
    deal_id: int,
    count: int,
    *,
    first: int = 0,
    max_price: int = 10_000,
) -> list[Receipt]:
    envelope = tiny_mlp_envelope()[0]
    receipts = []
    for index in range(first, first + count):
        task = sign_task(world, world.client, deal_id, index, envelope, max_price=max_price)
        body = api.post(
            "/v1/tasks", content=task.body, headers=task.headers(), params={"wait": 60}
        ).json()
        assert body["state"] == "succeeded", body
        receipts.append(Receipt.from_json(body["receipt"]))
    return receipts


def vouch(api: TestClient, world: ChainWorld, deal_id: int, receipts: list[Receipt]) -> None:
    voucher = Voucher(
        deal_id=deal_id,
        cumulative_amount=sum(r.amount for r in receipts),
        tasks=task_bitmap(r.task_index for r in receipts),
    )
    body: dict[str, Any] = {
        "voucher": voucher.to_json(),
        "signature": "0x" + voucher.sign(world.domain, world.client).hex(),
    }
    assert api.post("/v1/vouchers", json=body).status_code == 200


def test_lost_claim_when_mined_but_not_journaled_then_reconciled_and_finalized(
    api: TestClient, chain_world: ChainWorld, daemon: Daemon
) -> None:
    world = chain_world
    deal_id = world.open_deal()
    receipts = run_tasks(api, world, deal_id, 2)
    book = daemon.journal.deal(deal_id)
    assert book is not None
    claims = [
        Claim(r, book.acks[r.task_index].request.max_price, book.acks[r.task_index].request_sig)
        for r in receipts
    ]
    # The daemon's claim, sent and mined, but the daemon died before journaling it.
    world.escrow.claim_receipts(world.provider, deal_id, daemon.config.plan, claims)
    provider = address_of(world.provider)
    balance = world.escrow.balance_of(provider)

    daemon.jobs.watch_deals()

    claims = [s for s in book.settlements if s.action == "claim"]
    assert len(claims) == 1 and claims[0].data["tasks"] == [0, 1]
    assert claims[0].data["reconciled"] is True and claims[0].tx_hash
    assert daemon.jobs.reconcile_claims() == []  # journaled once only
    assert deal_id not in [c.deal_id for c in daemon.jobs.claim_due(force=True)]
    world.anvil.increase_time(CHALLENGE_WINDOW + 1)
    finalized = daemon.jobs.finalize_claims(deals=[deal_id])
    assert len(finalized) == 1
    assert world.escrow.balance_of(provider) == balance + sum(r.amount for r in receipts)
    assert world.escrow.get_deal(deal_id).pending == 0


def test_client_agreed_close_then_provider_redeems_claims_and_closes(
    api: TestClient, chain_world: ChainWorld, daemon: Daemon
) -> None:
    world = chain_world
    deal_id = world.open_deal()
    receipts = run_tasks(api, world, deal_id, 2)
    vouch(api, world, deal_id, receipts[:1])  # task 1 is delivered but never vouched
    provider, client = address_of(world.provider), address_of(world.client)
    balance, client_balance = world.escrow.balance_of(provider), world.escrow.balance_of(client)
    world.escrow.close_deal(world.client, deal_id)  # CloseAgreed by the client

    assert daemon.jobs.close_deals([deal_id]) == []  # voucher redeemed, task 1 claimed
    deal = world.escrow.get_deal(deal_id)
    assert deal.vouched == receipts[0].amount and deal.pending == receipts[1].amount
    world.anvil.increase_time(CHALLENGE_WINDOW + 1)
    assert daemon.jobs.close_deals([deal_id]) == [deal_id]

    deal = world.escrow.get_deal(deal_id)
    earned = sum(r.amount for r in receipts)
    assert deal.status == DEAL_CLOSED
    assert world.escrow.balance_of(provider) == balance + earned
    assert world.escrow.balance_of(client) == client_balance + deal.max_spend - earned
    assert daemon.jobs.close_deals([deal_id]) == []
    assert (
        api.get(f"/v1/deals/{deal_id}", headers=deal_access(world, deal_id)).json()["closed"]
        is True
    )


def test_expired_deal_then_provider_redeems_and_closes_alone(
    api: TestClient, chain_world: ChainWorld, daemon: Daemon
) -> None:
    world = chain_world
    deal_id = world.open_deal(duration=600)
    receipts = run_tasks(api, world, deal_id, 1)
    vouch(api, world, deal_id, receipts)
    provider = address_of(world.provider)
    balance = world.escrow.balance_of(provider)
    assert daemon.jobs.close_deals([deal_id]) == []  # open, and the client did not agree

    world.advance_to(world.escrow.get_deal(deal_id).expiry + CHALLENGE_WINDOW)
    assert daemon.jobs.close_deals([deal_id]) == []  # refunds stay possible for a window
    world.advance_to(world.escrow.get_deal(deal_id).expiry + 2 * CHALLENGE_WINDOW)
    closed = daemon.jobs.close_deals([deal_id])

    assert deal_id in closed
    assert world.escrow.get_deal(deal_id).status == DEAL_CLOSED
    assert world.escrow.balance_of(provider) == balance + receipts[0].amount


def test_client_agreed_close_with_a_refunded_task_still_running_then_provider_closes(
    api: TestClient, chain_world: ChainWorld, daemon: Daemon
) -> None:
    world = chain_world
    deal_id = world.open_deal()
    receipts = run_tasks(api, world, deal_id, 1)
    vouch(api, world, deal_id, receipts)
    slow = sign_task(world, world.client, deal_id, 1, spin_envelope(SLOW_STEPS))
    acked = api.post("/v1/tasks", content=slow.body, headers=slow.headers()).json()
    assert acked["state"] == "acked", acked
    ack = Ack.from_json(acked["ack"])
    deal = world.escrow.get_deal(deal_id)
    world.advance_to(settle_by(slow.request.deadline, deal.expiry, deal.challenge_window) + 1)
    world.escrow.refund_breach(
        world.client, slow.request, ack, bytes.fromhex(acked["ack_signature"][2:])
    )
    world.escrow.close_deal(world.client, deal_id)  # CloseAgreed by the client
    book = daemon.journal.deal(deal_id)
    assert book is not None and 1 not in book.receipts  # still running in the sandbox

    assert daemon.jobs.close_deals([deal_id]) == [deal_id]  # the refund does not hold it open

    assert world.escrow.get_deal(deal_id).status == DEAL_CLOSED
    assert world.escrow.task_status(deal_id, 1) == TASK_REFUNDED
    wait_until(lambda: 1 in book.receipts, what="the slow task's receipt")
    assert deal_id not in [c.deal_id for c in daemon.jobs.claim_due(force=True)]


def test_agreed_early_close_of_an_empty_deal_then_the_provider_completes_it(
    chain_world: ChainWorld, daemon: Daemon
) -> None:
    world = chain_world
    deal_id = world.open_deal()
    provider = address_of(world.provider)
    stake = world.escrow.stake_of(provider)
    world.escrow.close_deal(world.client, deal_id)  # CloseAgreed; the daemon never saw a task
    assert daemon.journal.deal(deal_id) is None

    report = daemon.jobs.run_all([deal_id])  # discovers the deal, then completes the close

    assert deal_id in report.discovered and deal_id in report.closed
    assert world.escrow.get_deal(deal_id).status == DEAL_CLOSED
    assert world.escrow.stake_of(provider) == stake + 10**6  # the deal's stake is free again
    book = daemon.journal.deal(deal_id)
    assert book is not None and book.closed() and book.opened() is not None


def test_expired_empty_deal_then_the_provider_closes_it_alone_and_frees_its_stake(
    chain_world: ChainWorld, daemon: Daemon
) -> None:
    world = chain_world
    deal_id = world.open_deal(duration=300)
    provider = address_of(world.provider)
    daemon.jobs.discover_deals()
    assert daemon.jobs.close_deals([deal_id]) == []
    stake = world.escrow.stake_of(provider)

    world.advance_to(world.escrow.get_deal(deal_id).expiry + 2 * CHALLENGE_WINDOW)

    assert daemon.jobs.close_deals([deal_id]) == [deal_id]
    assert world.escrow.stake_of(provider) == stake + 10**6


# ---- P1: a client's voucher cannot leave the cap short of the provider's acked tasks -------


def hand_over(api: TestClient, world: ChainWorld, voucher: Voucher) -> Any:
    """Hand a voucher to the daemon; return the response."""
    body = {
        "voucher": voucher.to_json(),
        "signature": "0x" + voucher.sign(world.domain, world.client).hex(),
    }
    return api.post("/v1/vouchers", json=body)


def settle_everything(world: ChainWorld, daemon: Daemon, deal_id: int) -> None:
    """Run the jobs as a silent client leaves them: redeem, claim, finalize after the window."""
    daemon.jobs.settle_due(force=True, deals=[deal_id])
    world.anvil.increase_time(CHALLENGE_WINDOW + 1)
    daemon.jobs.finalize_claims(deals=[deal_id])
    assert world.escrow.get_deal(deal_id).pending == 0


def test_voucher_that_overpays_one_task_is_refused_so_every_delivered_task_is_paid_in_full(
    api: TestClient, chain_world: ChainWorld, daemon: Daemon
) -> None:
    # Cap 1,000, two delivered tasks of 500. A voucher of 650 for the first (150 tip) would
    # leave 350 for the claim of the second, which the escrow would refuse (EscrowCapExceeded):
    # the provider would end with 650 of the 1,000 it delivered.
    world = chain_world
    deal_id = world.open_deal(max_spend=1_000)
    receipts = run_tasks(api, world, deal_id, 2, max_price=500)
    assert [r.amount for r in receipts] == [500, 500]
    provider = address_of(world.provider)
    balance = world.escrow.balance_of(provider)

    refused = hand_over(api, world, Voucher(deal_id, 650, task_bitmap([0])))

    assert refused.status_code == 422, refused.text
    assert refused.json()["error"] == "voucher_leaves_cap_short"
    book = daemon.journal.deal(deal_id)
    assert book is not None and book.latest_voucher is None  # nothing to redeem
    settle_everything(world, daemon, deal_id)  # the client went silent: both tasks claimed
    assert world.escrow.balance_of(provider) == balance + 1_000  # paid in full


def test_tip_that_fits_is_taken_and_then_tasks_are_acked_only_as_far_as_the_cap_covers(
    api: TestClient, chain_world: ChainWorld, daemon: Daemon
) -> None:
    # Cap 1,500, two delivered tasks of 500 and a voucher of 650 for the first: its tip (150)
    # fits in what the cap keeps free (500), so the daemon takes it. A third task of 500 would
    # then need 650 + 500 + 500 = 1,650 of the cap: the daemon refuses it (before this rule it
    # acked it, since 1,500 - 1,000 unpaid >= 500, and one of the claims would have reverted).
    world = chain_world
    deal_id = world.open_deal(max_spend=1_500)
    receipts = run_tasks(api, world, deal_id, 2, max_price=500)
    provider = address_of(world.provider)
    balance = world.escrow.balance_of(provider)
    taken = hand_over(api, world, Voucher(deal_id, 650, task_bitmap([0])))
    assert taken.status_code == 200, taken.text

    third = sign_task(world, world.client, deal_id, 2, tiny_mlp_envelope()[0], max_price=500)
    refused = api.post("/v1/tasks", content=third.body, headers=third.headers())

    assert refused.status_code == 402, refused.text
    assert refused.json()["error"] == "insufficient_budget"
    settle_everything(world, daemon, deal_id)
    assert world.escrow.get_deal(deal_id).vouched == 650
    assert world.escrow.balance_of(provider) == balance + 650 + receipts[1].amount


def test_overpaying_voucher_an_older_daemon_accepted_is_not_redeemed_and_its_task_is_claimed(
    api: TestClient, chain_world: ChainWorld, daemon: Daemon
) -> None:
    # A journal written before the rule may hold a tipping voucher: the redeem job checks the
    # cap again before it redeems, journals the voucher unusable and claims its task instead.
    world = chain_world
    deal_id = world.open_deal(max_spend=1_000)
    run_tasks(api, world, deal_id, 2, max_price=500)
    provider = address_of(world.provider)
    balance = world.escrow.balance_of(provider)
    tip = Voucher(deal_id, 650, task_bitmap([0]))
    daemon.journal.record_voucher(tip, tip.sign(world.domain, world.client))

    settle_everything(world, daemon, deal_id)

    book = daemon.journal.deal(deal_id)
    assert book is not None
    unusable = [s for s in book.settlements if s.action == "voucher_unusable"]
    assert [s.data["error"] for s in unusable] == ["cap_short"]
    assert world.escrow.get_deal(deal_id).vouched == 0
    assert sorted(book.claimed_tasks()) == [0, 1]
    assert world.escrow.balance_of(provider) == balance + 1_000


def test_client_crafting_vouchers_in_any_order_never_leaves_a_delivered_task_unpaid(
    api: TestClient, chain_world: ChainWorld, daemon: Daemon
) -> None:
    # Cap 1,500 and three delivered tasks of 500: the cap keeps nothing free. Every voucher
    # that would take more than it pays for is refused, whatever came before it; the ones
    # that pay exactly are taken; the provider ends with 1,500 for 1,500 delivered.
    world = chain_world
    deal_id = world.open_deal(max_spend=1_500)
    run_tasks(api, world, deal_id, 3, max_price=500)
    provider = address_of(world.provider)
    balance = world.escrow.balance_of(provider)
    attempts = [
        (Voucher(deal_id, 501, task_bitmap([0])), "voucher_leaves_cap_short"),  # a 1-unit tip
        (Voucher(deal_id, 500, task_bitmap([0])), None),
        (Voucher(deal_id, 600, task_bitmap([0])), "voucher_leaves_cap_short"),  # a tip alone
        (Voucher(deal_id, 1_000, task_bitmap([0, 1])), None),
        (Voucher(deal_id, 1_499, task_bitmap([0, 1, 2])), "voucher_underpays"),
        (Voucher(deal_id, 1_501, task_bitmap([0, 1, 2])), "voucher_over_cap"),
        (Voucher(deal_id, 1_200, task_bitmap([0, 1])), "voucher_leaves_cap_short"),
    ]
    for voucher, refusal in attempts:
        answer = hand_over(api, world, voucher)
        if refusal is None:
            assert answer.status_code == 200, (voucher, answer.text)
        else:
            assert answer.json()["error"] == refusal, (voucher, answer.text)

    settle_everything(world, daemon, deal_id)  # redeems the 1,000 voucher, claims task 2

    assert world.escrow.get_deal(deal_id).vouched == 1_000
    assert world.escrow.balance_of(provider) == balance + 1_500
