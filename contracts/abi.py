"""The compiled contracts' ABI, read by name: signatures, event topics, errors and events.

Everything Python knows of the contracts' errors and events comes from here, so nothing is
copied by hand from the Solidity sources: `contracts.reverts` builds its exceptions from
`entries(..., "error")`, the binding decodes events by the topics of `entries(..., "event")`.
"""

from __future__ import annotations

from typing import Any

from contracts.compiler import load_contracts, shipped_artifacts
from contracts.hashing import keccak_text

AbiEntry = dict[str, Any]


def abi_type(item: AbiEntry) -> str:
    """Return the canonical ABI type of an input (tuples spelled out, `(uint64,bool)[]`)."""
    kind = str(item["type"])
    if kind.startswith("tuple"):
        return "(" + ",".join(abi_type(c) for c in item["components"]) + ")" + kind[5:]
    return kind


def signature(item: AbiEntry) -> str:
    """Return the canonical signature of an ABI entry: `Name(type,...)`."""
    return f"{item['name']}({','.join(abi_type(i) for i in item['inputs'])})"


def topic(item: AbiEntry) -> bytes:
    """Return an event's first topic: keccak256 of its signature."""
    return keccak_text(signature(item))


def entries(abis: list[list[AbiEntry]], kind: str) -> dict[str, AbiEntry]:
    """Return the entries of one kind (`error`, `event`) of several ABIs by name.

    Contracts share some (the token's ERC-20 errors); raise ValueError if one name has two
    different signatures, which would make lookups by name ambiguous.
    """
    found: dict[str, AbiEntry] = {}
    for abi in abis:
        for item in abi:
            if item["type"] != kind:
                continue
            seen = found.setdefault(item["name"], item)
            if signature(seen) != signature(item):
                raise ValueError(f"two contract {kind}s are named {item['name']}")
    return found


def shipped_abis() -> list[list[AbiEntry]]:
    """Return the ABIs of the shipped artifacts (compiled from the sources if none are shipped).

    The shipped ones are read even when stale, so importing never runs the compiler; a test
    checks they equal a fresh compile.
    """
    shipped = shipped_artifacts()
    artifacts = shipped[0] if shipped is not None else load_contracts()
    return [artifact.abi for artifact in artifacts.values()]
