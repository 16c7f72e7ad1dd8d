"""The EIP-712 typed-data schema of every signed message, for wallets that sign without our code.

`contracts/typed_data.json` is the one definition of the signed types: `contracts.eip712`
derives every type string, type hash and field encoder from it, the Solidity structs and type
hashes are tested against it, and `schema(domain)` is what the market and the daemon serve at
`GET /v1/typed-data`: the same file with the escrow's domain filled in.

`messages[<name>].typedData` is, for each settlement message, everything of an
`eth_signTypedData_v4` request but the message: `types` (`EIP712Domain`, the message's struct
and every struct it refers to, nothing else), `primaryType` and `domain`. A wallet adds
`"message": {...}` (the fields by their typed-data names; bytes as 0x-hex) and signs. The
served schema's domain is the escrow's; the shipped file's holds `name` and `version`, and
`domainToFill` names what the signer adds (the escrow's `chainId` and `verifyingContract`).
`messages[<name>].signer` says who signs it. The top-level `types` (every struct) and
`primaryTypes` are kept for readers of the first form of this schema. `market` has the same
shape for the market's orders, under the market's domain (same chain and escrow address).
"""

from __future__ import annotations

import copy
from typing import Any

from contracts.eip712 import DEFINITION_FILE, Domain, definition

SCHEMA_FILE = DEFINITION_FILE


def _fill(section: dict[str, Any], domain: Domain) -> None:
    """Set every domain of a section (its own and each message's) to `domain`, in place."""
    filled = domain.as_dict()
    section["domain"] = dict(filled)
    for entry in section["messages"].values():
        entry["typedData"]["domain"] = dict(filled)
    del section["domainToFill"]


def schema(domain: Domain | None = None) -> dict[str, Any]:
    """Return the typed-data schema of every signed message; with `domain` (the escrow's),
    filled in for its chain and escrow, the market's section under the market's domain."""
    out = copy.deepcopy(definition())
    if domain is not None:
        market = out["market"]["domain"]
        _fill(out, domain)
        _fill(
            out["market"],
            Domain(
                chain_id=domain.chain_id,
                verifying_contract=domain.verifying_contract,
                name=market["name"],
                version=market["version"],
            ),
        )
    return out


def message_types(name: str) -> dict[str, list[dict[str, str]]]:
    """Return the `types` of one settlement message's typed data: `EIP712Domain`, the message's
    struct and every struct it refers to (eth-account takes the primary type to be the one
    struct no other refers to, so the types of other messages must not be there)."""
    types: dict[str, list[dict[str, str]]] = definition()["messages"][name]["typedData"]["types"]
    return copy.deepcopy(types)


def full_message(
    published: dict[str, Any], name: str, message: dict[str, Any], **domain: Any
) -> dict[str, Any]:
    """Return the `eth_signTypedData_v4` request of message `name` built from a published schema
    (served or shipped, as parsed JSON), the message's typed-data fields and, for the shipped
    schema, the domain fields it leaves to fill (`chainId`, `verifyingContract`).

    `name` is a settlement message, or a market order as `market.<name>` (`market.Bid`).
    """
    section = published
    if name.startswith("market."):
        section, name = published["market"], name.removeprefix("market.")
    entry = section["messages"][name]["typedData"]
    return {
        "types": entry["types"],
        "primaryType": entry["primaryType"],
        "domain": {**entry["domain"], **domain},
        "message": message,
    }


def shipped() -> dict[str, Any]:
    """Return the schema shipped in the package (`contracts/typed_data.json`)."""
    return copy.deepcopy(definition())
