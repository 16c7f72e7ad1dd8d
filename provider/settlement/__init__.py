"""Settlement jobs: every delivered task on chain before its settlement instant, with a margin.

Each task of a deal settles at ``settleBy = min(request.deadline, expiry) + challengeWindow``
(the escrow's one settlement instant): until then the provider may claim it, after it the
client may refund it. So every delivered task must be on chain (vouched by a redeemed
voucher, or claimed with the client's signed request) by ``settleBy``. The jobs act at the
latest at ``settleBy - margin``, ``margin = margin_fraction x challengeWindow``, which covers
one job interval plus one transaction (:class:`provider.config.SettlementConfig`; shorter
windows are refused when a task or a quote arrives). Until then the client has time to vouch,
and the jobs wait, so one voucher pays many tasks and one claim carries many.

Each job is a method of :class:`SettlementJobs` callable directly (tests trigger them after
moving the chain's clock); :meth:`SettlementJobs.start` runs :meth:`SettlementJobs.run_all`
every ``interval_s`` on an apscheduler ``BackgroundScheduler``, the first pass at once (after a
restart, whatever came due while the daemon was down is settled then). Every step is journaled;
a revert is logged and counted, and the job moves on to the next deal.

- **discover** the deals opened with this provider (``DealOpened`` logs by provider topic,
  from a cursor kept in the journal), so deals without tasks are closed too;
- **watch** deals: journal claim batches the chain holds but the journal lost (a claim mined
  just before the daemon died), refunds of overdue tasks, and deals closed on chain;
- **redeem** the latest acceptable voucher once a task it newly pays reaches its
  ``settleBy - margin``, or once its increase reaches ``redeem_threshold``. A voucher the
  escrow refuses is journaled ``voucher_unusable``: the tasks it covered are claimed instead;
  so is one that would leave the deal's cap short of the other acked tasks (the task service
  refuses those; a journal of an older daemon may hold one);
- **claim** delivered, on-time tasks that no acceptable voucher covers once they reach
  ``settleBy - margin``, up to ``claim_batch_max`` per transaction, each with the client's
  signed request; a task the chain refuses is dropped from the batch, which is sent again;
- **finalize** claimed batches once their challenge window has passed; a dispute the arbiter
  left past its period is lapsed (the client wins it), so the deal can close;
- **close** deals the client agreed to close (every task on chain or past its settlement
  instant, no claim pending) and deals past ``expiry + 2 x challengeWindow``: first redeem
  the latest voucher and, on an early close, claim what no voucher pays.

One module per job, all sharing one :class:`~provider.settlement.context.SettlementContext`
(the key, chain, journal, lock, and the journal-count-log steps every job takes):
:mod:`~provider.settlement.discovery`, :mod:`~provider.settlement.watch`,
:mod:`~provider.settlement.redeem`, :mod:`~provider.settlement.claim`,
:mod:`~provider.settlement.finalize`, :mod:`~provider.settlement.close`; the timer in
:mod:`~provider.settlement.schedule`; :class:`SettlementJobs` (:mod:`~provider.settlement.jobs`)
wires them. Every module logs as ``provider.settlement``.
"""

from provider.settlement.discovery import DEAL_SCAN_CURSOR
from provider.settlement.jobs import JobReport, SettlementJobs

__all__ = ["DEAL_SCAN_CURSOR", "JobReport", "SettlementJobs"]
