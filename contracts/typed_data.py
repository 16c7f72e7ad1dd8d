"""The EIP-712 typed-data schema of every signed message, for wallets that sign without our code.

`schema(domain)` is what the market and the daemon serve at `GET /v1/typed-data`, and
`contracts/typed_data.json` ships the same schema (without a domain) in the package.

`messages[<name>].typedData` is, for each signed message, everything of an
`eth_signTypedData_v4` request but the message: `types` (`EIP712Domain`, the message's struct
and every struct it refers to, nothing else), `primaryType` and `domain`. A wallet adds
`"message": {...}` (the fields by their typed-data names; bytes as 0x-hex) and signs. The
served schema's domain is the escrow's; the shipped file's holds `name` and `version`, and
`domainToFill` names what the signer adds (the escrow's `chainId` and `verifyingContract`).
`messages[<name>].signer` says who signs it. The top-level `types` (every struct) and
`primaryTypes` are kept for readers of the first form of this schema.
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


def message_types(name: str) -> dict[str, list[dict[str, str]]]:
    """Return the `types` of one message's typed data: `EIP712Domain`, the message's struct and
    every struct it refers to (eth-account takes the primary type to be the one struct no other
    refers to, so the types of other messages must not be there)."""
    message = next(m for m in MESSAGES if name == m.TYPE_NAME)
    return {"EIP712Domain": _DOMAIN_FIELDS, **message.typed_data_types()}


def schema(domain: Domain | None = None) -> dict[str, Any]:
    """Return the typed-data schema of every signed message; with `domain`, filled in for it."""
    types: dict[str, list[dict[str, str]]] = {"EIP712Domain": _DOMAIN_FIELDS}
    for message in MESSAGES:
        types.update(message.typed_data_types())
    filled = (
        domain.as_dict() if domain is not None else {"name": DOMAIN_NAME, "version": DOMAIN_VERSION}
    )
    out: dict[str, Any] = {
        "domain": filled,
        "types": types,
        "primaryTypes": {m.TYPE_NAME: {"signer": SIGNERS[m.TYPE_NAME]} for m in MESSAGES},
        "messages": {
            m.TYPE_NAME: {
                "signer": SIGNERS[m.TYPE_NAME],
                "typedData": {
                    "types": message_types(m.TYPE_NAME),
                    "primaryType": m.TYPE_NAME,
                    "domain": dict(filled),
                },
            }
            for m in MESSAGES
        },
    }
    if domain is None:
        out["domainToFill"] = ["chainId", "verifyingContract"]
    return out


def full_message(
    published: dict[str, Any], name: str, message: dict[str, Any], **domain: Any
) -> dict[str, Any]:
    """Return the `eth_signTypedData_v4` request of message `name` built from a published schema
    (served or shipped, as parsed JSON), the message's typed-data fields and, for the shipped
    schema, the domain fields it leaves to fill (`chainId`, `verifyingContract`)."""
    entry = published["messages"][name]["typedData"]
    return {
        "types": entry["types"],
        "primaryType": entry["primaryType"],
        "domain": {**entry["domain"], **domain},
        "message": message,
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
