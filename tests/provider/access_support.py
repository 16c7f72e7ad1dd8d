"""Access proofs for reads of the daemon's API: a task's result or a deal's summary."""

from __future__ import annotations

import time

from contracts.access import ACCESS_EXPIRY_HEADER, ACCESS_SIGNATURE_HEADER, result_access_digest
from contracts.messages import sign_digest
from provider.access import DEAL_SCOPE
from tests.provider.daemon_support import ChainWorld


def proof(world: ChainWorld, key: str, deal_id: int, index: int) -> dict[str, str]:
    """Return access headers signed by ``key`` for (deal, index), valid for 5 minutes."""
    expiry = int(time.time()) + 300
    digest = result_access_digest(world.domain, deal_id, index, expiry)
    return {
        ACCESS_EXPIRY_HEADER: str(expiry),
        ACCESS_SIGNATURE_HEADER: "0x" + sign_digest(digest, key).hex(),
    }


def deal_access(world: ChainWorld, deal_id: int, key: str | None = None) -> dict[str, str]:
    """Return headers proving that the caller (the deal's client by default) is a party."""
    return proof(world, key or world.client, deal_id, DEAL_SCOPE)
