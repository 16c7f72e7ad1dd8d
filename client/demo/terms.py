"""The demo's embedded defaults: amounts, timeouts, and the two providers' terms."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from contracts.messages import Plan
from contracts.pricing import outcome_based

UNIT: Final = 10**6  # one token (6 decimals)
CLIENT_FUNDS: Final = 100 * UNIT  # minted to the client's wallet
CLIENT_DEPOSIT: Final = 10 * UNIT  # deposited into the escrow
PROVIDER_STAKE: Final = 5 * UNIT
DEVICE_CLASS: Final = "cpu"  # what the daemons advertise (they compile for TPU ahead of time)
TPU_TARGET: Final = "v5e:1x1"
SETTLEMENT_INTERVAL_S: Final = 1  # the daemons' settlement jobs run this often ...
TX_ALLOWANCE_S: Final = 2  # ... and allow this long for one transaction to be mined
# The client hands over a cumulative voucher per verified task; the daemons redeem a deal's
# latest one when a task it pays is due (settleBy - window / 2) or at the close, never for its
# amount alone (no demo deal's cap reaches this): one redemption pays every task vouched.
REDEEM_THRESHOLD: Final = 10 * UNIT
# The daemons put every task on chain by settleBy - window / 2, and that margin must cover one
# job interval and one transaction: they serve windows from (1 + 2) / 0.5 = 6 s. The demo's
# escrow is deployed with this window as its minimum (the production default is 60 s).
CHALLENGE_WINDOW: Final = 10
DEAL_DURATION: Final = 3_600
START_TIMEOUT_S: Final = 120.0
QUOTE_WAIT_S: Final = 60.0  # for a provider's daemon to sign the quote of a fill
CLOSE_TIMEOUT_S: Final = 60.0
BID_PRICE: Final = 10_000
BID_SLO_MS: Final = 120_000


@dataclass(frozen=True)
class ProviderProfile:
    """One demo provider: its plan, SLO, ask and deal terms."""

    name: str
    plan: Plan
    slo_ms: int
    ask_price: int  # per unit (a unit is one task's worth of budget)
    ask_quantity: int
    penalty: int
    stake: int
    note: str


ALPHA: Final = ProviderProfile(
    name="alpha",
    plan=outcome_based(compile_price=20_000, inference_price=4_000),
    slo_ms=120_000,
    ask_price=10_000,
    ask_quantity=8,
    penalty=50_000,
    stake=1 * UNIT,
    note="dearer, SLO 120 s",
)
BETA: Final = ProviderProfile(
    name="beta",
    plan=outcome_based(compile_price=10_000, inference_price=2_000),
    slo_ms=1_000,
    ask_price=5_000,
    ask_quantity=6,
    penalty=50_000,
    stake=1 * UNIT,
    note="cheaper, promises 1 s on one worker: too slow",
)
PROFILES: Final = (ALPHA, BETA)
