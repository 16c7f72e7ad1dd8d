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
from client.demo.deals import Deal
from client.demo.errors import DemoError
from client.demo.terms import CHALLENGE_WINDOW, CLOSE_TIMEOUT_S, REDEEM_TIMEOUT_S
from client.demo.text import Say, tokens
from contracts.binding import DEAL_CLOSED, DealState, Escrow
from contracts.hashing import keccak_text
from contracts.messages import Voucher

_DEAL_CLOSED_TOPIC = "0x" + keccak_text("DealClosed(uint256,uint256,uint256)").hex()

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


def refund_late(deals: list[Deal], say: Say) -> None:
    """Refund, with the penalty, every acked task not verified by its deadline (+ window)."""
    outcomes = [o for deal in deals for o in deal.outcomes]
    candidates = [o for o in outcomes if o.ack is not None and not o.verified]
    if not candidates:
        return
    due = max(o.ack.deadline for o in candidates if o.ack) + CHALLENGE_WINDOW + 1
    wait = due - time.time()
    if wait > 0:
        say(f"waiting   {wait:.0f} s for the challenge window after the missed deadlines")
        time.sleep(wait)  # the chain's clock follows the wall clock
    for deal in deals:
        for outcome in deal.session.refund_breaches(int(time.time())):
            refund, penalty = outcome.refunded or (0, 0)
            say(
                f"refunded  {deal.profile.name} #{outcome.index}: {tokens(refund)} back + "
                f"penalty {tokens(penalty)} from the provider's stake"
            )


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
            "topics": [_DEAL_CLOSED_TOPIC, "0x" + deal_id.to_bytes(32, "big").hex()],
        }
    )
    for event in escrow.decode_events(logs):
        return int(event.args["returnedToClient"]), int(event.args["stakeReturned"])
    raise DemoError(f"deal {deal_id} is closed but its DealClosed event was not found")
