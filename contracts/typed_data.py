"""The EIP-712 typed-data schema of every signed message, for wallets that sign without our code.

`schema(domain)` is what the market and the daemon serve at `GET /v1/typed-data`, and
`contracts/typed_data.json` ships the same schema (without a domain) in the package. A wallet
fills `domain` with the escrow's chain id and address, picks `primaryType`, and signs
`{"types": ..., "primaryType": ..., "domain": ..., "message": ...}` with `eth_signTypedData_v4`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from contracts.messages import (
    DOMAIN_NAME,
    DOMAIN_VERSION,
    Ack,
    Domain,
    Quote,
    Receipt,
    TaskRequest,
    Voucher,
)

SCHEMA_FILE = Path(__file__).resolve().parent / "typed_data.json"
MESSAGES = (Quote, TaskRequest, Ack, Receipt, Voucher)
SIGNERS = {
    "Quote": "provider",
    "TaskRequest": "client",
    "Ack": "provider",
    "Receipt": "provider",
    "Voucher": "client",
}
_DOMAIN_FIELDS = [
    {"name": "name", "type": "string"},
    {"name": "version", "type": "string"},
    {"name": "chainId", "type": "uint256"},
    {"name": "verifyingContract", "type": "address"},
]


def schema(domain: Domain | None = None) -> dict[str, Any]:
    """Return the typed-data schema of every signed message; with `domain`, filled in for it."""
    types: dict[str, list[dict[str, str]]] = {"EIP712Domain": _DOMAIN_FIELDS}
    for message in MESSAGES:
        types.update(message.typed_data_types())
    return {
        "domain": domain.as_dict()
        if domain is not None
        else {"name": DOMAIN_NAME, "version": DOMAIN_VERSION},
        "types": types,
        "primaryTypes": {m.TYPE_NAME: {"signer": SIGNERS[m.TYPE_NAME]} for m in MESSAGES},
    }


def shipped() -> dict[str, Any]:
    """Return the schema shipped in the package (`contracts/typed_data.json`)."""
    data: dict[str, Any] = json.loads(SCHEMA_FILE.read_text())
    return data


def write() -> None:
    """Write the shipped schema file from the message definitions."""
    SCHEMA_FILE.write_text(json.dumps(schema(), indent=2, sort_keys=True) + "\n")


if __name__ == "__main__":
    write()
