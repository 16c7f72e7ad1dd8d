"""Refunds of one deal's SLO breaches, from the client's side.

A task acked but not verified (undelivered, late or wrong) is refunded on chain with the
penalty once its settlement instant has passed (``settleBy = min(deadline, expiry) +
challengeWindow``), after asking the provider once more for its result: a delivery that
verifies by its deadline is paid instead.
"""

from __future__ import annotations

from client.errors import ClientError, DeliveryRejected
from client.provider_http import TaskView
from client.session import DealSession
from client.tasks import BreachResult, TaskOutcome, TaskSpec, settle_by
from contracts.errors import ChainError, ContractRevert
from contracts.messages import Ack, TaskRequest
from contracts.reverts import EscrowDeadlineNotPassed, EscrowTaskAlreadySettled


def settle_breach(
    session: DealSession,
    request: TaskRequest,
    ack: Ack,
    ack_signature: bytes,
    chain_now: int,
    *,
    spec: TaskSpec | None = None,
    ask_provider: bool = True,
) -> BreachResult:
    """Refund an acked, unverified task once its settlement instant has passed on chain.

    First the provider is asked once more for the result: a delivery that verifies (by
    its deadline) is returned for payment instead. A task already settled on chain comes
    back as ``settled`` with its state.
    """
    _, expiry = session.terms()
    index = request.task_index
    if chain_now <= settle_by(request.deadline, expiry, session.challenge_window):
        return BreachResult("not_due")
    detail = ""
    late: TaskView | None = None
    if ask_provider:
        try:
            view = session.provider.fetch(session.deal_id, index, wait_s=0)
        except ClientError as exc:
            detail = f"provider: {exc}"
        else:
            if view.receipt is not None:
                try:
                    receipt = session.verify_view(request, ack, view, spec)
                except DeliveryRejected as exc:
                    detail, late = exc.reason, view
                else:
                    return BreachResult("delivered", view=view, receipt=receipt)
    try:
        refunded = session.account.refund_breach(request, ack, ack_signature)
    except EscrowTaskAlreadySettled:
        state = session.payments.chain_states([index]).get(index)
        return BreachResult("settled", chain=state, view=late, detail=detail)
    except EscrowDeadlineNotPassed:
        return BreachResult("not_due")
    except (ContractRevert, ChainError) as exc:
        return BreachResult("failed", detail=str(exc))
    return BreachResult("refunded", refund=refunded, view=late, detail=detail)


def breached(session: DealSession, chain_now: int) -> list[TaskOutcome]:
    """Return acked tasks not verified (undelivered, late or wrong) past their instant."""
    _, expiry = session.terms()
    return [
        o
        for o in session.outcomes.values()
        if o.ack is not None
        and not o.verified
        and o.refunded is None
        and not o.claimed
        and chain_now > settle_by(o.request.deadline, expiry, session.challenge_window)
    ]


def refund_breaches(session: DealSession, chain_now: int) -> list[TaskOutcome]:
    """Refund every breached task on chain with the penalty; return those refunded.

    A task the provider delivered after all (asked once more) enters the voucher book
    instead (call `DealSession.pay` again); one it already claimed on chain is left for the
    dispute watcher (`client.watch`).
    """
    refunded = []
    for outcome in breached(session, chain_now):
        assert outcome.ack is not None
        result = settle_breach(
            session,
            outcome.request,
            outcome.ack,
            outcome.ack_signature,
            chain_now,
            spec=outcome.spec,
        )
        if result.kind == "delivered" and result.view is not None:
            session.accept_delivery(outcome, result.view)
        elif result.kind == "refunded":
            outcome.refunded = result.refund
            if result.view is not None:
                outcome.view, outcome.rejected = result.view, result.detail
            session.payments.mark_claimed(outcome.index)
            refunded.append(outcome)
        elif result.kind == "settled":
            outcome.claimed = True
            outcome.rejected = outcome.rejected or f"{result.chain} on chain by the provider"
            session.payments.mark_claimed(outcome.index)
    return refunded
