"""Who may read a task's result: the deal's client, proven by a token or a fresh signature.

Two proofs, either one per request (checked by :meth:`ResultAccess.check`):

- the **access token** returned with the signed ack when the submission created it
  (``access_token`` in the answer to the first ``POST /v1/tasks`` of a task; a repeat of the
  request, which anyone can rebuild from a claim's calldata, gets none):
  ``<expiry>.<HMAC of (chain, escrow, deal, task, expiry)>`` under a secret derived from the
  provider's key, so it survives restarts and costs no lookup, names its audience and stops
  working at ``expiry`` (:data:`TOKEN_TTL_S` after it was issued); sent as
  ``X-Tpumarket-Access``;
- a **client signature** over ``contracts.access.result_access_digest(domain, deal, task,
  expiry)`` with an expiry at most :data:`MAX_ACCESS_TTL_S` ahead, sent as
  ``X-Tpumarket-Access-Expiry`` and ``X-Tpumarket-Access-Signature``; it must recover to the
  deal's client.

A deal's summary (``GET /v1/deals/{id}``) is for its two parties: a signature by the deal's
client or provider over the same digest with the task index :data:`DEAL_SCOPE` (no task has
it: task indexes are ``uint32``), checked by :meth:`ResultAccess.check_deal`.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Callable, Mapping

from contracts.access import (
    ACCESS_EXPIRY_HEADER,
    ACCESS_SIGNATURE_HEADER,
    ACCESS_TAG,
    ACCESS_TOKEN_HEADER,
    result_access_digest,
)
from contracts.errors import SignatureError
from contracts.messages import Domain, recover_digest
from provider.errors import RejectedError

MAX_ACCESS_TTL_S = 3600
TOKEN_TTL_S = 3600
"""How long an access token reads a task's result after the ack that issued it."""
DEAL_SCOPE = 2**256 - 1
"""The task index in ``result_access_digest`` of a proof that reads a whole deal's summary."""
Key = tuple[int, int]


class ResultAccess:
    """Issue access tokens and check either proof for one provider under one domain."""

    def __init__(self, private_key: str, domain: Domain) -> None:
        """Derive the token secret from the provider's key (never sent anywhere)."""
        self._secret = hashlib.sha256(
            ACCESS_TAG + bytes.fromhex(private_key.removeprefix("0x"))
        ).digest()
        self.domain = domain
        self._separator = domain.separator()

    def token(self, key: Key, now: float) -> tuple[str, int]:
        """Return a new access token of a task and its expiry (unix seconds)."""
        expiry = int(now) + TOKEN_TTL_S
        return f"{expiry}.{self._mac(key, expiry)}", expiry

    def _mac(self, key: Key, expiry: int) -> str:
        message = (
            self._separator
            + key[0].to_bytes(32, "big")
            + key[1].to_bytes(32, "big")
            + expiry.to_bytes(8, "big")
        )
        return hmac.new(self._secret, message, hashlib.sha256).hexdigest()

    def _check_token(self, key: Key, token: str, now: float) -> None:
        """Return if ``token`` is this task's and has not expired; raise ``access_denied``."""
        expiry_text, _, mac = token.strip().lower().partition(".")
        if not expiry_text.isdigit() or len(expiry_text) > 12 or not 0 <= key[0] < 2**256:
            raise RejectedError("access_denied", "malformed access token")
        expiry = int(expiry_text)
        sent = mac.encode("utf-8", "replace")
        if not hmac.compare_digest(sent, self._mac(key, expiry).encode()):
            raise RejectedError("access_denied", f"the access token is not for task {key}")
        if expiry <= now:
            raise RejectedError(
                "access_denied",
                f"the access token expired at {expiry}: sign a fresh {ACCESS_SIGNATURE_HEADER}",
            )

    def check(
        self,
        key: Key,
        headers: Mapping[str, str],
        *,
        client_of: Callable[[int], str],
        now: float,
    ) -> None:
        """Return if ``headers`` prove the caller is the deal's client; raise otherwise.

        ``access_required`` (401) when no proof is sent, ``access_denied`` (403) when the
        proof is wrong, expired or signed by someone else.
        """
        token = headers.get(ACCESS_TOKEN_HEADER.lower())
        if token is not None:
            self._check_token(key, token, now)
            return
        signer = self._signer(key, headers, now)
        client = client_of(key[0])
        if signer.lower() != client.lower():
            raise RejectedError(
                "access_denied",
                f"access signed by {signer}, but deal {key[0]}'s client is {client}",
            )

    def check_deal(
        self,
        deal_id: int,
        headers: Mapping[str, str],
        *,
        parties: Callable[[], tuple[str, str]],
        now: float,
    ) -> None:
        """Return if ``headers`` prove the caller is the deal's client or provider.

        The proof is a signature over ``result_access_digest(domain, deal, DEAL_SCOPE,
        expiry)``; ``parties()`` returns (client, provider). Same codes as :meth:`check`.
        """
        signer = self._signer((deal_id, DEAL_SCOPE), headers, now)
        if signer.lower() not in {party.lower() for party in parties()}:
            raise RejectedError(
                "access_denied", f"access signed by {signer}, not a party to deal {deal_id}"
            )

    def _signer(self, key: Key, headers: Mapping[str, str], now: float) -> str:
        """Return who signed the access proof in ``headers`` for ``key``; raise if none or bad."""
        expiry_text = headers.get(ACCESS_EXPIRY_HEADER.lower())
        signature = headers.get(ACCESS_SIGNATURE_HEADER.lower())
        if expiry_text is None or signature is None:
            raise RejectedError(
                "access_required",
                f"results are for the deal's parties: send {ACCESS_TOKEN_HEADER} (from the ack) "
                f"or {ACCESS_EXPIRY_HEADER} and {ACCESS_SIGNATURE_HEADER}",
            )
        try:
            expiry = int(expiry_text.strip()[:24])
            raw = bytes.fromhex(signature.strip().removeprefix("0x"))
        except ValueError as exc:
            raise RejectedError("access_denied", "malformed access proof") from exc
        if expiry <= now:
            raise RejectedError("access_denied", f"the access signature expired at {expiry}")
        if expiry > now + MAX_ACCESS_TTL_S:
            raise RejectedError(
                "access_denied", f"the access expiry is more than {MAX_ACCESS_TTL_S} s ahead"
            )
        if not 0 <= key[0] < 2**256 or not 0 <= key[1] < 2**256:
            raise RejectedError("access_denied", "the deal or task number is out of range")
        try:
            return recover_digest(result_access_digest(self.domain, *key, expiry), raw)
        except SignatureError as exc:
            raise RejectedError("access_denied", f"bad access signature: {exc}") from exc
