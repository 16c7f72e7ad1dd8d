"""HTTP client of a provider daemon's task API (see docs/provider-api.md).

Only transient network errors (connection failures, timeouts, 502/503/504) are retried, with
backoff; a 4xx is a typed `ProviderRejected` at once.

Results are for the deal's client only: a fetch sends the access token that came with the
task's ack (kept per task by this client until shortly before it expires), or, without a live
one, a short-lived signature by `client_key` over `result_access_digest(...)`. A resubmitted
request (after this process restarted, say) is answered with the ack alone and no token, so its
results are read with a fresh signature; a token the provider refuses (expired, or from
before the provider's key changed) is dropped and the read signed instead.
"""

from __future__ import annotations

import base64
import json
import threading
import time
from dataclasses import dataclass
from typing import Any

import httpx

from client.errors import ProviderRejected, ProviderUnavailable
from contracts.access import (
    ACCESS_EXPIRY_HEADER,
    ACCESS_SIGNATURE_HEADER,
    ACCESS_TOKEN_HEADER,
    result_access_digest,
)
from contracts.messages import Ack, Domain, Receipt, TaskRequest, Voucher, sign_digest

TRANSIENT_STATUS = frozenset({502, 503, 504})
ACCESS_TTL_S = 300
TOKEN_MARGIN_S = 60
"""A token this close to its expiry is not sent: the read is signed instead."""


@dataclass(frozen=True)
class TaskView:
    """A provider's answer about one task: its ack and, once delivered, receipt and outputs."""

    state: str
    ack: Ack
    ack_signature: bytes
    receipt: Receipt | None
    receipt_signature: bytes
    outputs: bytes | None
    report: dict[str, Any] | None
    diagnosis: dict[str, Any] | None

    @property
    def delivered(self) -> bool:
        """Return whether the task has a receipt."""
        return self.receipt is not None


def _hex(value: str | None) -> bytes:
    return bytes.fromhex(value.removeprefix("0x")) if value else b""


class ProviderHttp:
    """A synchronous client of one provider daemon."""

    def __init__(
        self,
        base_url: str,
        *,
        timeout_s: float = 120.0,
        retries: int = 4,
        client_key: str | None = None,
    ) -> None:
        """Talk to the daemon at `base_url`; `client_key` signs result reads without a token."""
        self.base_url = base_url.rstrip("/")
        self.retries = retries
        self._http = httpx.Client(base_url=self.base_url, timeout=timeout_s)
        self._client_key = client_key
        self._domain: Domain | None = None
        self._tokens: dict[tuple[int, int], tuple[str, int]] = {}
        self._lock = threading.Lock()

    def info(self) -> dict[str, Any]:
        """Return the provider's address, chain, escrow, plan and SLO."""
        body: dict[str, Any] = self._request("GET", "/v1/info").json()
        return body

    def submit(
        self,
        request: TaskRequest,
        signature: bytes,
        envelope: bytes,
        *,
        target: str | None = None,
        wait_s: float = 0,
    ) -> TaskView:
        """Submit a signed task; return the ack (and the result if it came within `wait_s`)."""
        headers = {
            "Content-Type": "application/octet-stream",
            "X-Tpumarket-Request": _json_header(request.to_json()),
            "X-Tpumarket-Signature": "0x" + signature.hex(),
        }
        if target is not None:
            headers["X-Tpumarket-Target"] = target
        response = self._request(
            "POST", "/v1/tasks", content=envelope, headers=headers, params={"wait": wait_s}
        )
        return self._view(response.json())

    def fetch(self, deal_id: int, task_index: int, *, wait_s: float = 0) -> TaskView:
        """Return the state of a task, long-polling up to `wait_s` for its delivery."""
        response = self._read(f"/v1/tasks/{deal_id}/{task_index}", (deal_id, task_index), wait_s)
        return self._view(response.json())

    def receipt(self, deal_id: int, task_index: int, *, wait_s: float = 0) -> Receipt | None:
        """Return a task's signed receipt (None before delivery), also once its outputs are
        released after settlement: the receipt outlives them."""
        path = f"/v1/tasks/{deal_id}/{task_index}"
        body = self._read(path, (deal_id, task_index), wait_s).json()
        receipt = body.get("receipt")
        return Receipt.from_json(receipt) if receipt is not None else None

    def _read(self, path: str, key: tuple[int, int], wait_s: float | None = None) -> httpx.Response:
        """GET a result path with our access proof; a refused token is dropped and the read
        signed instead (when we hold the client's key)."""
        params = None if wait_s is None else {"wait": wait_s}
        headers = self._access(*key)
        try:
            return self._request("GET", path, params=params, headers=headers)
        except ProviderRejected as exc:
            if ACCESS_TOKEN_HEADER not in headers or exc.status != 403:
                raise
            with self._lock:
                self._tokens.pop(key, None)
            if self._client_key is None:
                raise
            return self._request("GET", path, params=params, headers=self._access(*key))

    def _access(self, deal_id: int, task_index: int) -> dict[str, str]:
        """Return the headers that prove we are the deal's client (empty if we cannot)."""
        with self._lock:
            token = self._tokens.get((deal_id, task_index))
        if token is not None and token[1] > time.time() + TOKEN_MARGIN_S:
            return {ACCESS_TOKEN_HEADER: token[0]}
        if self._client_key is None:
            return {}
        if self._domain is None:
            info = self.info()
            self._domain = Domain(chain_id=int(info["chain_id"]), verifying_contract=info["escrow"])
        expiry = int(time.time()) + ACCESS_TTL_S
        digest = result_access_digest(self._domain, deal_id, task_index, expiry)
        signature = sign_digest(digest, self._client_key)
        return {ACCESS_EXPIRY_HEADER: str(expiry), ACCESS_SIGNATURE_HEADER: "0x" + signature.hex()}

    def send_voucher(self, voucher: Voucher, signature: bytes) -> bool:
        """Hand over a signed cumulative voucher; return whether it was new to the provider."""
        body = {"voucher": voucher.to_json(), "signature": "0x" + signature.hex()}
        return bool(self._request("POST", "/v1/vouchers", json=body).json().get("new", False))

    def close(self) -> None:
        """Close the connection pool."""
        self._http.close()

    def _view(self, body: dict[str, Any]) -> TaskView:
        receipt = body.get("receipt")
        key = (int(body["deal_id"]), int(body["task_index"]))
        if body.get("access_token") and body.get("access_expires_at") is not None:
            with self._lock:
                self._tokens[key] = (str(body["access_token"]), int(body["access_expires_at"]))
        outputs: bytes | None = None
        if receipt is not None and body.get("outputs_released_after_settlement"):
            raise ProviderRejected(
                410,
                "outputs_pruned",
                f"task {key[1]} of deal {key[0]} is settled on chain and the provider has "
                "released its outputs: they can no longer be fetched",
            )
        if body.get("outputs_b64") is not None:
            outputs = base64.b64decode(body["outputs_b64"])
        elif receipt is not None and body.get("outputs_size"):
            outputs = self._read(f"/v1/tasks/{key[0]}/{key[1]}/outputs", key).content
        return TaskView(
            state=str(body["state"]),
            ack=Ack.from_json(body["ack"]),
            ack_signature=_hex(body.get("ack_signature")),
            receipt=Receipt.from_json(receipt) if receipt is not None else None,
            receipt_signature=_hex(body.get("receipt_signature")),
            outputs=outputs,
            report=body.get("report"),
            diagnosis=body.get("diagnosis"),
        )

    def _request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        delay = 0.1
        for attempt in range(self.retries + 1):
            try:
                response = self._http.request(method, path, **kwargs)
            except (httpx.TransportError, httpx.TimeoutException) as exc:
                if attempt == self.retries:
                    raise ProviderUnavailable(f"{self.base_url}{path}: {exc}") from exc
            else:
                if response.status_code not in TRANSIENT_STATUS:
                    if response.status_code >= 400:
                        raise _rejected(response)
                    return response
                if attempt == self.retries:
                    raise _rejected(response)
            time.sleep(delay)  # backoff before retrying a transient failure
            delay = min(delay * 2, 2.0)
        raise AssertionError("unreachable")


def _rejected(response: httpx.Response) -> ProviderRejected:
    try:
        body = response.json()
        error, reason = str(body.get("error", "error")), str(body.get("reason", body))
    except ValueError:
        error, reason = "error", response.text[:300]
    return ProviderRejected(response.status_code, error, reason)


def _json_header(value: dict[str, Any]) -> str:
    return json.dumps(value, separators=(",", ":"))
