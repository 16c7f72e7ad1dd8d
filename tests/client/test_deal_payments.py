"""A deal's payments from the client's side, against a real escrow: the session's voucher book
reconciled with the chain, and vouchers signed only for what is newly owed."""

from __future__ import annotations

from client.accounts import ClientAccount
from client.deal_payments import DealPayments
from client.ledger_records import ChainState
from client.provider_http import ProviderHttp
from client.session import DealSession
from client.vouchers import VoucherBook
from contracts.chain import free_port
from contracts.messages import Voucher, address_of, task_bitmap
from tests.contracts.builders import DEFAULT_PLAN, claim, open_deal, redeem, signed_task, voucher
from tests.contracts.conftest import World


def _payments(world: World, client: str, provider: str, deal_id: int) -> DealPayments:
    """The payments of a session on the deal (its provider is gone: a closed port)."""
    deal = world.escrow.get_deal(deal_id)
    session = DealSession(
        provider=ProviderHttp(f"http://127.0.0.1:{free_port()}", retries=1),
        account=ClientAccount(world.escrow, world.token, client),
        domain=world.escrow.domain,
        deal_id=deal_id,
        plan=DEFAULT_PLAN,
        provider_address=address_of(provider),
        book=VoucherBook(deal_id=deal_id, cap=deal.max_spend),
        challenge_window=deal.challenge_window,
    )
    assert session.payments.book is session.book
    return session.payments


def test_reconcile_when_tasks_settle_on_chain_then_claimed_ones_leave_the_book(
    world: World,
) -> None:
    client, provider = world.clients[0], world.providers[0]
    deal_id, _ = open_deal(world, client, provider)
    tasks = [signed_task(world, deal_id, i, client, provider) for i in range(3)]
    payments = _payments(world, client, provider, deal_id)
    for task in tasks[:2]:
        payments.add(task.receipt)
    redeem(world, client, provider, voucher(deal_id, tasks[0].receipt.amount, [0]))
    claim(world, provider, deal_id, [tasks[1]])  # the provider claimed it instead

    assert payments.reconcile() == {0: ChainState.VOUCHED, 1: ChainState.CLAIMED}
    assert payments.book.paid == {0: tasks[0].receipt.amount}
    assert payments.confirmed_vouched == {0}
    assert payments.reconcile() == {}  # task 0 is known vouched: not read again
    payments.add_payable(tasks[1].receipt)  # verified late: still never paid twice
    assert payments.book.paid == {0: tasks[0].receipt.amount}


def test_sign_voucher_when_nothing_new_is_owed_then_signs_only_a_resend_above_the_floor(
    world: World,
) -> None:
    client, provider = world.clients[0], world.providers[0]
    deal_id, _ = open_deal(world, client, provider)
    tasks = [signed_task(world, deal_id, i, client, provider) for i in range(2)]
    payments = _payments(world, client, provider, deal_id)
    payments.restore({0: tasks[0].receipt.amount}, set(), 0, frozenset(), vouched=set())
    payments.add(tasks[1].receipt)
    total = tasks[0].receipt.amount + tasks[1].receipt.amount

    signed = payments.sign_voucher(0)
    assert signed is not None and signed[0] == Voucher(deal_id, total, task_bitmap([0, 1]))
    assert payments.sign_voucher(0) is None  # nothing new since
    resent = payments.sign_voucher(0, resend=True)  # signed, but maybe never handed over
    assert resent == signed
    assert payments.sign_voucher(total, resend=True) is None  # the chain has it already
    world.escrow.redeem_voucher(provider, *signed)
    assert world.escrow.get_deal(deal_id).vouched == total
    assert payments.prepare_voucher() is None
