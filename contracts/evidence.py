"""Evidence for an arbiter: what each party signs when it hands its side of a disputed task over.

The client sends the task's program envelope, the provider its outputs. Each upload carries the
sender's signature over :func:`evidence_digest`, which binds the bytes to one role, task, batch,
deal, chain and escrow, so an upload cannot be replayed for another task or passed off as the
other party's. The arbiter, the client SDK and the provider daemon share these names.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any

import numpy as np

from contracts.eip712 import Domain
from contracts.errors import EscrowError
from contracts.hashing import keccak256

EVIDENCE_TAG = b"tpumarket.arbiter-evidence.v1"
RULING_READ_TAG = b"tpumarket.arbiter-ruling-read.v1"
ARBITER_ADVERT_TAG = b"tpumarket.arbiter-advert.v1"
EVIDENCE_SIGNATURE_HEADER = "X-Tpumarket-Evidence-Signature"
EVIDENCE_TARGET_HEADER = "X-Tpumarket-Target"
READ_EXPIRY_HEADER = "X-Tpumarket-Read-Expiry"
READ_SIGNATURE_HEADER = "X-Tpumarket-Read-Signature"


MEMORY_RTOL = 0.01
"""Relative tolerance on a compile report's memory figures (XLA's analysis is deterministic
for one compiler version; 1% allows for a patch release's layout differences)."""


DEFAULT_RTOL = {"float16": 1e-2, "bfloat16": 2e-2, "float32": 1e-3, "float64": 1e-9}
DEFAULT_ATOL = {"float16": 1e-3, "bfloat16": 1e-2, "float32": 1e-4, "float64": 1e-12}
"""Default tolerances by float dtype. float32: the largest difference measured between CPU
configurations (threads, XLA optimisation level 0, fast math; ``scripts/measure_tolerance.py``,
docs/arbiter.md) was 3.8e-6 absolute, 8.3e-5 relative: the bounds leave a factor of about 25."""


@dataclass(frozen=True, slots=True)
class Tolerance:
    """How far a re-execution may differ from delivered outputs, by dtype kind.

    Floats compare with ``|got - want| <= atol + rtol * |want|`` (NaN equal to NaN in the same
    place); integers and booleans must be equal. Both parties see the policy before a deal
    (``GET /v1/info``), so it is part of the terms they accept when they name this arbiter.
    """

    float_rtol: Mapping[str, float] = field(default_factory=lambda: dict(DEFAULT_RTOL))
    float_atol: Mapping[str, float] = field(default_factory=lambda: dict(DEFAULT_ATOL))

    def as_json(self) -> dict[str, Any]:
        """Return the policy as published."""
        return {
            "float": {
                name: {"rtol": self.float_rtol[name], "atol": self.float_atol[name]}
                for name in sorted(self.float_rtol)
            },
            "integer": "exact",
            "bool": "exact",
            "compile_memory_rtol": MEMORY_RTOL,
        }

    def compare(self, got: Mapping[str, Any], want: Mapping[str, Any]) -> str | None:
        """Return why ``got`` (re-executed) differs from ``want`` (delivered), or None."""
        if sorted(got) != sorted(want):
            return f"output names differ: {sorted(want)} delivered, {sorted(got)} re-executed"
        for name in sorted(want):
            a, b = np.asarray(got[name]), np.asarray(want[name])
            if a.shape != b.shape or a.dtype != b.dtype:
                return (
                    f"output {name}: {b.dtype}{list(b.shape)} delivered, "
                    f"{a.dtype}{list(a.shape)} re-executed"
                )
            if a.dtype.kind == "f" or a.dtype.name == "bfloat16":
                key = a.dtype.name
                rtol, atol = self.float_rtol.get(key, 1e-4), self.float_atol.get(key, 1e-5)
                x, y = a.astype(np.float64), b.astype(np.float64)
                if not np.allclose(x, y, rtol=rtol, atol=atol, equal_nan=True):
                    worst = float(np.nanmax(np.abs(x - y))) if x.size else 0.0
                    return f"output {name} differs by up to {worst:.3g} (rtol {rtol}, atol {atol})"
            elif not np.array_equal(a, b):
                return f"output {name} differs (exact comparison for {a.dtype})"
        return None


def compare_outputs(got: bytes, want: bytes, tolerance: Tolerance) -> str | None:
    """Return why the safetensors outputs ``got`` differ from ``want`` within ``tolerance``
    (either not decoding is a difference), or None when they agree."""
    from programs.envelope import ArrayFormat, ProgramFormatError, decode_arrays

    try:
        a = decode_arrays(got, ArrayFormat.SAFETENSORS)
        b = decode_arrays(want, ArrayFormat.SAFETENSORS)
    except ProgramFormatError as exc:
        return f"outputs are not safetensors: {exc}"
    return tolerance.compare(a, b)


def tolerance_from_policy(policy: Mapping[str, Any]) -> Tolerance:
    """Return the tolerance an arbiter publishes (``GET /v1/info``'s ``tolerance``)."""
    floats = policy.get("float", {})
    return Tolerance(
        float_rtol={k: float(v["rtol"]) for k, v in floats.items()},
        float_atol={k: float(v["atol"]) for k, v in floats.items()},
    )


class Role(IntEnum):
    """Which side of a dispute an upload comes from."""

    CLIENT_PROGRAM = 1
    PROVIDER_OUTPUTS = 2


def evidence_digest(
    domain: Domain, deal_id: int, batch_id: int, task_index: int, role: Role, body_sha256: bytes
) -> bytes:
    """Return what a party signs to hand a body (by its sha256) to the arbiter for one task.

    ``keccak256(tag || domain separator || uint256 deal || uint32 batch || uint32 task ||
    uint8 role || sha256(body))``.
    """
    if len(body_sha256) != 32:
        raise ValueError("body_sha256 must be 32 bytes")
    return keccak256(
        EVIDENCE_TAG
        + domain.separator()
        + deal_id.to_bytes(32, "big")
        + batch_id.to_bytes(4, "big")
        + task_index.to_bytes(4, "big")
        + bytes([int(role)])
        + body_sha256
    )


def ruling_read_digest(domain: Domain, deal_id: int, batch_id: int, expiry: int) -> bytes:
    """Return what a party signs to read a ruling's released outputs until ``expiry``."""
    return keccak256(
        RULING_READ_TAG
        + domain.separator()
        + deal_id.to_bytes(32, "big")
        + batch_id.to_bytes(4, "big")
        + expiry.to_bytes(8, "big")
    )


def arbiter_advert_digest(domain: Domain, advert_hash: bytes, timestamp: int) -> bytes:
    """Return what an arbiter signs to advertise on a market: its advert (by the keccak256 of
    its canonical JSON) at ``timestamp``, under the market's domain (one market, chain, escrow).

    ``keccak256(tag || domain separator || advert hash || uint64 timestamp)``: the tag keeps an
    arbiter's advert from passing as a provider's heartbeat or any other signed message.
    """
    if len(advert_hash) != 32:
        raise ValueError("advert_hash must be 32 bytes")
    return keccak256(
        ARBITER_ADVERT_TAG + domain.separator() + advert_hash + timestamp.to_bytes(8, "big")
    )


class EvidenceUploadError(EscrowError):
    """The arbiter refused an upload or could not be reached; the message says which."""


def upload_evidence(
    arbiter_url: str,
    domain: Domain,
    key: str,
    *,
    deal_id: int,
    batch_id: int,
    task_index: int,
    role: Role,
    body: bytes,
    target: str | None = None,
    timeout_s: float = 60.0,
) -> dict[str, object]:
    """Sign ``body`` for one disputed task and PUT it to the arbiter; return its answer.

    Raise :class:`EvidenceUploadError` with the arbiter's code and reason on a refusal.
    """
    import httpx

    from contracts.signing import sign_digest

    digest = evidence_digest(
        domain, deal_id, batch_id, task_index, role, hashlib.sha256(body).digest()
    )
    headers = {EVIDENCE_SIGNATURE_HEADER: "0x" + sign_digest(digest, key).hex()}
    if target is not None:
        headers[EVIDENCE_TARGET_HEADER] = target
    part = "program" if role is Role.CLIENT_PROGRAM else "outputs"
    url = f"{arbiter_url.rstrip('/')}/v1/evidence/{deal_id}/{batch_id}/{task_index}/{part}"
    try:
        answer = httpx.put(url, content=body, headers=headers, timeout=timeout_s)
    except httpx.HTTPError as exc:
        raise EvidenceUploadError(f"arbiter at {arbiter_url} not reached: {exc}") from None
    if answer.status_code != 200:
        try:
            detail = answer.json()
            reason = f"{detail.get('error')}: {detail.get('reason')}"
        except ValueError:
            reason = answer.text[:200]
        raise EvidenceUploadError(f"arbiter refused the {part} of task {task_index}: {reason}")
    result: dict[str, object] = answer.json()
    return result
