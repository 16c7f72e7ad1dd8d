"""The short requests for warm workers, and what names a program's metadata (parent side)."""

from __future__ import annotations

import functools
import hashlib
import json

from programs.envelope import ProgramEnvelope
from provider.sandbox.compile_store import client_id
from provider.sandbox.pool import WarmCall


def warm_call(envelope: ProgramEnvelope, client: str | None) -> WarmCall:
    """The short request for a worker that ran this program with these weights and this
    metadata for this client: an envelope stating other producer versions or platforms is
    checked in full (a version refused by a cold worker is refused by a warm one too)."""
    tenant = client_id(client)
    weights = envelope.weights_sha256  # set when the envelope was checked
    if weights is None and envelope.weights is not None:
        weights = hashlib.sha256(envelope.weights).digest()
    return WarmCall(
        key=tenant.encode()
        + envelope.program_sha256
        + metadata_digest(envelope)
        + (b"" if weights is None else weights),
        request={
            "op": "run_warm",
            "client": tenant,
            "program": envelope.program_sha256.hex(),
            "weights": None if weights is None else weights.hex(),
            "array_format": envelope.array_format.value,
            "inputs_sha256": envelope.inputs_sha256.hex(),
        },
        payload=envelope.inputs,
    )


def metadata_digest(envelope: ProgramEnvelope) -> bytes:
    """Hash what an envelope states about its program besides its bytes."""
    producer = envelope.producer
    return _metadata_hash(
        producer.jax, producer.jaxlib, producer.calling_convention, tuple(envelope.platforms)
    )


@functools.lru_cache(maxsize=256)
def _metadata_hash(
    jax: str, jaxlib: str, calling_convention: int, platforms: tuple[str, ...]
) -> bytes:
    # Every task of a warm program states the same few values: hashed once, not twice a task.
    metadata = [jax, jaxlib, calling_convention, list(platforms)]
    return hashlib.sha256(json.dumps(metadata).encode()).digest()
