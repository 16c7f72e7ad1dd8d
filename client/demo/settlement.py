"""Settlement as the client sees it: redemption by the providers, refunds, the close.

The providers' own settlement jobs redeem the client's vouchers and close the deals; the demo
only signs, refunds what was late, agrees to close, and waits (bounded) for the chain to show
each step.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Mapping

from client.accounts import ClientAccount
from client.deal_refunds import refund_breaches
from client.demo.deals import Deal
from client.demo.errors import DemoError
from client.demo.terms import CHALLENGE_WINDOW, CLOSE_TIMEOUT_S, REDEEM_TIMEOUT_S
from client.demo.text import Say, tokens
from contracts.binding import DEAL_CLOSED, DealState, Escrow, indexed_topic
from contracts.chain import rpc
from contracts.messages import Voucher

Check = Callable[[str], None]  # raises if the named provider's daemon has exited


def wait_for_redemption(
    escrow: Escrow,
    deals: list[Deal],
    vouchers: Mapping[str, Voucher | None],
    check: Check,
    say: Say,
) -> None:
    """Wait until each provider's settlement job has redeemed its latest voucher."""
    deadline = time.monotonic() + REDEEM_TIMEOUT_S
    for deal in deals:
        voucher = vouchers.get(deal.profile.name)
        if voucher is None:
            continue
        _wait(
            escrow,
            deal,
            check,
            functools.partial(_redeemed, voucher.cumulative_amount),
            deadline,
            f"{deal.profile.name} did not redeem its voucher for deal {deal.chain_id} "
            f"within {REDEEM_TIMEOUT_S:.0f} s",
        )
        say(f"redeemed  deal {deal.chain_id} ({deal.profile.name}) by the provider's job")


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
    settlement job then settles what it is owed and calls ``closeDeal`` itself, which closes
    the deal (``DealClosed``) and returns the unspent funds and the stake.
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
        returned, stake = _closed(escrow, deal.chain_id)
        say(
            f"closed    deal {deal.chain_id} ({deal.profile.name}) by the provider's job "
            f"{time.monotonic() - agreed:.1f} s later: {tokens(returned)} back to the client, "
            f"stake {tokens(stake)} back to the provider"
        )


def _redeemed(amount: int, state: DealState) -> bool:
    return state.vouched >= amount


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
    logs = escrow.tx.w3.eth.get_logs(
        {
            "address": escrow.address,
            "fromBlock": 0,
            "toBlock": "latest",
            "topics": [escrow.event_topic("DealClosed"), indexed_topic(deal_id)],
        }
    )
    for event in escrow.decode_events(logs):
        return int(event.args["returnedToClient"]), int(event.args["stakeReturned"])
    raise DemoError(f"deal {deal_id} is closed but its DealClosed event was not found")
