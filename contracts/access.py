"""Reading a task's result: the proofs a provider accepts from the deal's client.

Both sides of the task API share these names and this digest: the client sends one proof per
read, the provider checks it (``provider.access``).
"""

from __future__ import annotations

from contracts.eip712 import Domain
from contracts.hashing import keccak256

ACCESS_TAG = b"tpumarket.result-access.v1"
ACCESS_TOKEN_HEADER = "X-Tpumarket-Access"
ACCESS_EXPIRY_HEADER = "X-Tpumarket-Access-Expiry"
ACCESS_SIGNATURE_HEADER = "X-Tpumarket-Access-Signature"


def result_access_digest(domain: Domain, deal_id: int, task_index: int, expiry: int) -> bytes:
    """Return what a client signs to read a task's result until `expiry` (unix seconds).

    `keccak256("tpumarket.result-access.v1" || domain separator || uint256 dealId ||
    uint256 taskIndex || uint64 expiry)`: valid for one task on one chain and escrow.
    """
    return keccak256(
        ACCESS_TAG
        + domain.separator()
        + deal_id.to_bytes(32, "big")
        + task_index.to_bytes(32, "big")
        + expiry.to_bytes(8, "big")
    )
