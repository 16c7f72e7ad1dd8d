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

The deal's client may **revoke** its tokens (``POST /v1/deals/{id}/access/revoke``): a fresh
signature over the same digest with the task index :data:`REVOKE_SCOPE` and, in place of the
expiry, a cut-off ``before`` (unix seconds, within :data:`REVOKE_SKEW_S` of the daemon's
clock). Every token of the deal issued at or before the cut-off is refused from then on, and a
token issued later in the same second is issued as of the next one, so it still works. The
cut-offs only move forward (a replayed revocation changes nothing) and are kept in a file of
the data dir, written before the answer, so a restart keeps them; a cut-off is forgotten once
every token it refuses has expired anyway.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import threading
from collections.abc import Callable, Mapping
from pathlib import Path

from contracts.access import (
    ACCESS_EXPIRY_HEADER,
    ACCESS_SIGNATURE_HEADER,
    ACCESS_TAG,
    ACCESS_TOKEN_HEADER,
    result_access_digest,
)
from contracts.errors import SignatureError
from contracts.messages import Domain, recover_digest
from provider.errors import ProviderError, RejectedError

MAX_ACCESS_TTL_S = 3600
TOKEN_TTL_S = 3600
"""How long an access token reads a task's result after the ack that issued it."""
DEAL_SCOPE = 2**256 - 1
"""The task index in ``result_access_digest`` of a proof that reads a whole deal's summary."""
REVOKE_SCOPE = 2**256 - 2
"""The task index in ``result_access_digest`` of a client's revocation of a deal's tokens."""
REVOKE_SKEW_S = 300
"""How far a revocation's cut-off may be from the daemon's clock (a fresh signature)."""
REVOCATIONS_FILE = "access-revocations.json"
Key = tuple[int, int]


class ResultAccess:
    """Issue access tokens and check either proof for one provider under one domain."""

    def __init__(
        self, private_key: str, domain: Domain, *, revocations: Path | None = None
    ) -> None:
        """Derive the token secret from the provider's key (never sent anywhere).

        ``revocations`` is the file that keeps the clients' revocations across restarts
        (none: kept in memory only).
        """
        self._secret = hashlib.sha256(
            ACCESS_TAG + bytes.fromhex(private_key.removeprefix("0x"))
        ).digest()
        self.domain = domain
        self._separator = domain.separator()
        self._revocations_path = revocations
        self._revoked: dict[int, int] = {}  # deal -> tokens issued at or before are refused
        self._revoke_lock = threading.Lock()
        if revocations is not None and revocations.exists():
            self._revoked = _load_revocations(revocations)

    def token(self, key: Key, now: float) -> tuple[str, int]:
        """Return a new access token of a task and its expiry (unix seconds)."""
        issued = max(int(now), self._revoked.get(key[0], -1) + 1)
        expiry = issued + TOKEN_TTL_S
        return f"{expiry}.{self._mac(key, expiry)}", expiry

    def revoked_through(self, deal_id: int) -> int | None:
        """Return the cut-off of a deal's revoked tokens (none revoked: ``None``)."""
        return self._revoked.get(deal_id)

    def revocation_signer(self, deal_id: int, before: int, signature: str, now: float) -> str:
        """Return who signed a revocation of ``deal_id``'s tokens up to ``before``.

        ``signature`` is over ``result_access_digest(domain, deal, REVOKE_SCOPE, before)``;
        ``before`` must lie within :data:`REVOKE_SKEW_S` of ``now`` (checked first).
        """
        if not 0 < deal_id < 2**256:
            raise RejectedError("bad_request", "the deal number is out of range")
        if abs(before - now) > REVOKE_SKEW_S:
            raise RejectedError(
                "access_denied",
                f"the revocation's cut-off {before} is more than {REVOKE_SKEW_S} s from the "
                f"provider's clock {int(now)}: sign a fresh one",
            )
        raw = _signature_bytes(signature)
        try:
            return recover_digest(
                result_access_digest(self.domain, deal_id, REVOKE_SCOPE, before), raw
            )
        except SignatureError as exc:
            raise RejectedError("access_denied", f"bad revocation signature: {exc}") from exc

    def revoke(self, deal_id: int, before: int, *, signer: str, client: str, now: float) -> int:
        """Refuse every token of ``deal_id`` issued at or before ``before``; return the cut-off.

        ``signer`` (from :meth:`revocation_signer`) must be the deal's ``client``. The cut-off
        in force is the latest of all revocations; it is on disk when this returns.
        """
        if signer.lower() != client.lower():
            raise RejectedError(
                "access_denied",
                f"revocation signed by {signer}, but deal {deal_id}'s client is {client}",
            )
        with self._revoke_lock:
            cutoff = max(before, self._revoked.get(deal_id, before))
            revoked = {
                deal: through
                for deal, through in self._revoked.items()
                if through + TOKEN_TTL_S > now  # a token it refuses may still be unexpired
            }
            revoked[deal_id] = cutoff
            if self._revocations_path is not None:
                _store_revocations(self._revocations_path, revoked)
            self._revoked = revoked
        return cutoff

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
        revoked = self._revoked.get(key[0])
        if revoked is not None and expiry - TOKEN_TTL_S <= revoked:
            raise RejectedError(
                "access_denied",
                f"the deal's client revoked its tokens issued up to {revoked}: sign a fresh "
                f"{ACCESS_SIGNATURE_HEADER}",
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
        signer = self.proven_signer(key, headers, now)
        if signer is not None:
            self.require_client(key, signer, client_of(key[0]))

    def proven_signer(self, key: Key, headers: Mapping[str, str], now: float) -> str | None:
        """Check the proof in ``headers`` without the deal: a token fully (return ``None``),
        a signature up to who signed it (return the signer, to pass to :meth:`require_client`).
        """
        token = headers.get(ACCESS_TOKEN_HEADER.lower())
        if token is not None:
            self._check_token(key, token, now)
            return None
        return self._signer(key, headers, now)

    @staticmethod
    def require_client(key: Key, signer: str, client: str) -> None:
        """Raise ``access_denied`` unless ``signer`` is the deal's ``client``."""
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
        self.require_party(deal_id, self.deal_signer(deal_id, headers, now), parties())

    def deal_signer(self, deal_id: int, headers: Mapping[str, str], now: float) -> str:
        """Return who signed the deal-summary proof in ``headers``; raise if none or bad."""
        return self._signer((deal_id, DEAL_SCOPE), headers, now)

    @staticmethod
    def require_party(deal_id: int, signer: str, parties: tuple[str, str]) -> None:
        """Raise ``access_denied`` unless ``signer`` is one of the deal's ``parties``."""
        if signer.lower() not in {party.lower() for party in parties}:
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
        except ValueError as exc:
            raise RejectedError("access_denied", "malformed access proof") from exc
        raw = _signature_bytes(signature)
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


def _signature_bytes(signature: str) -> bytes:
    """Return a 65-byte signature from its hex; raise ``access_denied`` before any crypto."""
    text = signature.strip().removeprefix("0x")
    if len(text) != 130:
        raise RejectedError("access_denied", "malformed access proof: 65 bytes of hex expected")
    try:
        return bytes.fromhex(text)
    except ValueError as exc:
        raise RejectedError("access_denied", "malformed access proof") from exc


def _load_revocations(path: Path) -> dict[int, int]:
    """Return the revocations kept in ``path``; a file not of this form stops the daemon."""
    try:
        raw = json.loads(path.read_text())
        return {int(deal): int(through) for deal, through in raw["revoked_through"].items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ProviderError(f"cannot read the access revocations in {path}: {exc}") from exc


def _store_revocations(path: Path, revoked: dict[int, int]) -> None:
    """Write the revocations to ``path`` atomically and durably (temp file, fsync, rename)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps({"revoked_through": {str(d): t for d, t in sorted(revoked.items())}})
    temp = path.with_name(path.name + ".tmp")
    with open(temp, "w") as out:
        out.write(text)
        out.flush()
        os.fsync(out.fileno())
    os.replace(temp, path)
    directory = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)
