"""The arbiter advertises on a market: fee, tolerance policy, deadlines and measured ruling time.

The advert is what naming this arbiter in a deal means. Its ruling time is measured, not
claimed: the median, over the rulings in the journal, of chain seconds from the dispute to the
decision. It is signed with the arbiter's key over
:func:`contracts.evidence.arbiter_advert_digest` under the market's domain and posted to
``POST /v1/arbiters`` (the market keeps the latest). :class:`AdvertJob` posts it at start and
every ``advert_interval_s`` while the arbiter runs.
"""

from __future__ import annotations

import logging
import statistics
import time
from typing import Any

import httpx

from contracts.eip712 import Domain
from contracts.evidence import arbiter_advert_digest
from contracts.orders import advert_hash, market_domain
from contracts.signing import sign_digest
from provider.arbiter.errors import ArbiterError
from provider.arbiter.journal import ArbiterJournal, CaseState
from provider.arbiter.service import ArbiterTerms

log = logging.getLogger("provider.arbiter.advert")


class AdvertRefused(ArbiterError):
    """The market refused the advert or could not be reached; the message says which."""


def ruling_seconds(journal: ArbiterJournal) -> list[int]:
    """Return, for each journaled ruling, chain seconds from the dispute to the decision."""
    spans = []
    for case in journal.cases(CaseState.RULED, CaseState.DONE):
        if case.ruling is not None and "decided_at" in case.ruling:
            spans.append(int(case.ruling["decided_at"]) - case.dispute.disputed_at)
    return spans


def build_advert(
    *, address: str, url: str, terms: ArbiterTerms, journal: ArbiterJournal
) -> dict[str, Any]:
    """Return the advert of this arbiter: its terms and its measured ruling time."""
    spans = ruling_seconds(journal)
    tolerance = terms.tolerance
    return {
        "role": "arbiter",
        "arbiter": address,
        "url": url,
        "fee": terms.fee,
        "evidence_window_s": terms.evidence_window_s,
        "ruling_margin_s": terms.ruling_margin_s,
        "tolerance": {
            name: {"rtol": tolerance.float_rtol[name], "atol": tolerance.float_atol[name]}
            for name in sorted(tolerance.float_rtol)
        },
        "rulings": len(spans),
        "ruling_s_p50": float(statistics.median(spans)) if spans else None,
    }


def post_advert(
    market_url: str, domain: Domain, key: str, advert: dict[str, Any], *, timestamp: int
) -> dict[str, Any]:
    """Sign ``advert`` at ``timestamp`` under ``domain`` (the market's) and post it."""
    digest = arbiter_advert_digest(domain, advert_hash(advert), timestamp)
    body = {
        "arbiter": advert["arbiter"],
        "timestamp": timestamp,
        "advert": advert,
        "signature": "0x" + sign_digest(digest, key).hex(),
    }
    try:
        answer = httpx.post(market_url.rstrip("/") + "/v1/arbiters", json=body, timeout=30)
    except httpx.HTTPError as exc:
        raise AdvertRefused(f"market at {market_url} not reached: {exc}") from None
    if answer.status_code != 200:
        raise AdvertRefused(f"market refused the advert: {answer.status_code} {answer.text[:300]}")
    result: dict[str, Any] = answer.json()
    return result


class AdvertJob:
    """Post this arbiter's advert to a market at start and every ``interval_s`` after."""

    def __init__(
        self,
        *,
        market_url: str,
        chain_id: int,
        escrow: str,
        key: str,
        address: str,
        url: str,
        terms: ArbiterTerms,
        journal: ArbiterJournal,
        interval_s: float,
    ) -> None:
        """Advertise ``address`` (serving at ``url``) on the market at ``market_url``."""
        self.market_url = market_url
        self.domain = market_domain(chain_id, escrow)
        self._key = key
        self.address = address
        self.url = url
        self.terms = terms
        self.journal = journal
        self.interval_s = interval_s
        self._last = 0.0
        self._last_ts = 0

    def tick(self) -> bool:
        """Post the advert if it is due; return whether it was posted (refusals are logged)."""
        now = time.time()
        if now - self._last < self.interval_s:
            return False
        advert = build_advert(
            address=self.address, url=self.url, terms=self.terms, journal=self.journal
        )
        # The market takes an advert only if its timestamp is after the last one it holds.
        stamp = max(int(now), self._last_ts + 1)
        try:
            post_advert(self.market_url, self.domain, self._key, advert, timestamp=stamp)
        except AdvertRefused as exc:
            log.warning("advert not posted", extra={"error": str(exc)})
            return False
        self._last, self._last_ts = now, stamp
        log.info("advert posted", extra={"market": self.market_url, "rulings": advert["rulings"]})
        return True
