"""Settlement as the client sees it: vouchers, refunds, the close and what it redeemed.

The client pays per task: each verified delivery brings a new cumulative voucher, handed to the
provider at once, so every delivered task is covered by a voucher long before the provider's
job would claim it (at ``settleBy - window / 2``). The providers' own settlement jobs redeem
each deal's latest voucher (when a task it pays is due, or at the close: see
``terms.REDEEM_THRESHOLD``) and close the deals; the demo only signs, refunds what was late,
agrees to close, waits (bounded) for the chain to show each close, and says what was redeemed.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from client.accounts import ClientAccount
from client.deal_refunds import refund_breaches
from client.demo.deals import Deal
from client.demo.errors import DemoError
from client.demo.terms import CHALLENGE_WINDOW, CLOSE_TIMEOUT_S
from client.demo.text import Say, tokens
from contracts.binding import DEAL_CLOSED, DealState, Escrow, indexed_topic
from contracts.chain import rpc
from contracts.messages import Voucher
from contracts.transactor import Event

Check = Callable[[str], None]  # raises if the named provider's daemon has exited


def vouch(deal: Deal, say: Say, index: int | None = None) -> Voucher | None:
    """Sign the deal's cumulative voucher for every delivery verified so far and hand it to
    the provider; return it, or None when nothing new is owed.

    Nothing is new when the last voucher already covers the verified task ``index`` (another
    task's voucher was signed after this one entered the book: then that is said), or when only
    a diagnosed failure was verified, which costs nothing under the outcome-based plan (the
    next voucher covers it at 0).
    """
    voucher = deal.session.pay()
    last = deal.voucher
    if voucher is None:
        if index is not None and last is not None and last.covers(index):
            say(
                f"voucher   deal {deal.chain_id} ({deal.profile.name}): #{index} is in the last "
                f"one handed over ({tokens(last.cumulative_amount)} in all for "
                f"{_count(_tasks(last), 'verified task')})"
            )
        return None
    deal.voucher = voucher
    say(
        f"voucher   deal {deal.chain_id} ({deal.profile.name}): "
        f"{tokens(voucher.cumulative_amount)} in all for "
        f"{_count(_tasks(voucher), 'verified task')}, handed to the provider"
    )
    return voucher


def _tasks(voucher: Voucher) -> int:
    """Return how many tasks ``voucher`` covers."""
    return sum(bin(word).count("1") for word in voucher.tasks)


def _count(n: int, what: str) -> str:
    return f"{n} {what}{'' if n == 1 else 's'}"


def refund_late(escrow: Escrow, deals: list[Deal], say: Say) -> None:
    """Refund, with the penalty, every acked task not verified, once its settleBy has passed.

    A task is refundable only after ``settleBy = min(deadline, expiry) + challengeWindow`` on
    the chain's clock. Rather than wait for it in wall time, the demo moves anvil's clock
    forward (``evm_increaseTime`` + ``evm_mine``), and says so.
    """
    candidates = [
        (deal, o) for deal in deals for o in deal.outcomes if o.ack is not None and not o.verified
    ]
    if not candidates:
        return
    due = max(
        min(o.request.deadline, escrow.get_deal(deal.chain_id).expiry)
        + deal.session.challenge_window
        for deal, o in candidates
    )
    now = chain_now(escrow)
    if now <= due:
        jump = due + 1 - now
        rpc_url = escrow.tx.w3.provider.endpoint_uri  # type: ignore[attr-defined]
        rpc(rpc_url, "evm_increaseTime", [jump])
        rpc(rpc_url, "evm_mine")
        say(
            f"clock     moved the chain's clock {jump} s forward (anvil evm_increaseTime + "
            f"evm_mine) past the settlement instant of {len(candidates)} late task(s): "
            f"deadline + the {CHALLENGE_WINDOW} s challenge window, instead of waiting"
        )
    now = chain_now(escrow)
    for deal in deals:
        for outcome in refund_breaches(deal.session, now):
            refund, penalty = outcome.refunded or (0, 0)
            say(
                f"refunded  {deal.profile.name} #{outcome.index}: {tokens(refund)} back + "
                f"penalty {tokens(penalty)} from the provider's stake"
            )


def chain_now(escrow: Escrow) -> int:
    """Return the latest block's timestamp."""
    return int(escrow.tx.w3.eth.get_block("latest")["timestamp"])


def close_deals(
    escrow: Escrow, account: ClientAccount, deals: list[Deal], check: Check, say: Say
) -> None:
    """Agree to close each deal as its client; wait for each provider's job to close it.

    The client's ``closeDeal`` records its agreement (``CloseAgreed``); the provider's
    settlement job then redeems the client's latest voucher if it has not yet, settles what
    else it is owed and calls ``closeDeal`` itself, which closes the deal (``DealClosed``) and
    returns the unspent funds and the stake. Raise ``DemoError`` if a closed deal's vouched
    amount is not the client's latest voucher.
    """
    for deal in deals:
        account.close(deal.chain_id)
        say(f"agreed    to close deal {deal.chain_id} ({deal.profile.name}) early, as the client")
    agreed = time.monotonic()
    deadline = agreed + CLOSE_TIMEOUT_S
    for deal in deals:
        _wait(
            escrow,
            deal,
            check,
            lambda state: state.status == DEAL_CLOSED,
            deadline,
            f"{deal.profile.name} did not close deal {deal.chain_id} within "
            f"{CLOSE_TIMEOUT_S:.0f} s of the client's agreement (see its log)",
        )
        closed_after = time.monotonic() - agreed
        _say_redeemed(escrow, deal, say)
        returned, stake = _closed(escrow, deal.chain_id)
        say(
            f"closed    deal {deal.chain_id} ({deal.profile.name}) by the provider's job "
            f"{closed_after:.1f} s later: {tokens(returned)} back to the client, "
            f"stake {tokens(stake)} back to the provider"
        )


def _say_redeemed(escrow: Escrow, deal: Deal, say: Say) -> None:
    """Say how the provider redeemed the client's vouchers of a closed deal."""
    voucher = deal.voucher
    if voucher is None:
        return
    vouched = escrow.get_deal(deal.chain_id).vouched
    if vouched != voucher.cumulative_amount:
        raise DemoError(
            f"deal {deal.chain_id} ({deal.profile.name}) closed with {tokens(vouched)} vouched, "
            f"not the {tokens(voucher.cumulative_amount)} of the client's latest voucher"
        )
    times = len(_events(escrow, "VoucherRedeemed", deal.chain_id))
    say(
        f"redeemed  deal {deal.chain_id} ({deal.profile.name}): the client's latest voucher, "
        f"{tokens(vouched)} for {_count(_tasks(voucher), 'task')}, by the provider's job "
        f"({_count(times, 'redemption')} on chain)"
    )


def _wait(
    escrow: Escrow,
    deal: Deal,
    check: Check,
    done: Callable[[DealState], bool],
    deadline: float,
    failure: str,
) -> None:
    """Poll the deal's state until `done`; raise DemoError(`failure`) past `deadline`."""
    while not done(escrow.get_deal(deal.chain_id)):
        check(deal.profile.name)
        if time.monotonic() > deadline:
            raise DemoError(failure)
        time.sleep(0.2)  # the providers' jobs settle on their own schedule


def _closed(escrow: Escrow, deal_id: int) -> tuple[int, int]:
    """Return what the deal's ``DealClosed`` event returned: (to the client, stake)."""
    for event in _events(escrow, "DealClosed", deal_id):
        return int(event.args["returnedToClient"]), int(event.args["stakeReturned"])
    raise DemoError(f"deal {deal_id} is closed but its DealClosed event was not found")


def _events(escrow: Escrow, name: str, deal_id: int) -> list[Event]:
    """Return the deal's escrow events called ``name`` (the deal id is their first topic)."""
    logs = escrow.tx.w3.eth.get_logs(
        {
            "address": escrow.address,
            "fromBlock": 0,
            "toBlock": "latest",
            "topics": [escrow.event_topic(name), indexed_topic(deal_id)],
        }
    )
    return list(escrow.decode_events(logs))
