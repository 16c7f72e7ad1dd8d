"""Errors and events come from the compiled ABI: each has its Python counterpart, and back.

Every custom error of a fresh compile is a `contracts.reverts` exception of the same name that
the binding's decoder raises for its revert data; every error name Python code imports exists.
Every event decodes by its ABI entry, found by topic; every event name Python code reads exists.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from eth_abi.abi import encode as abi_encode
from hexbytes import HexBytes

from contracts import reverts
from contracts.abi import abi_type, entries, signature, topic
from contracts.binding import decoder, indexed_topic
from contracts.compiler import REPO_ROOT, compile_contracts
from contracts.errors import ContractRevert
from contracts.transactor import selector_of

from .conftest import World

SOURCES = ("contracts", "programs", "services", "market", "provider", "client", "scripts", "tests")
SAMPLES: dict[str, Any] = {
    "address": "0x" + "11" * 20,
    "bool": True,
    "bytes32": b"\x07" * 32,
    "string": "x",
    "uint256[]": [1, 2**255],
    "uint32[]": [3, 4],
}


def sample(kind: str) -> Any:
    """Return a value of ABI type `kind` for encoding."""
    return SAMPLES.get(kind, 5 if kind.startswith("uint") else None)


def python_sources() -> dict[Path, str]:
    """Return the text of every Python file of the project but this one (which names an error
    and an event that must not exist)."""
    return {
        path: path.read_text()
        for root in SOURCES
        for path in (REPO_ROOT / root).rglob("*.py")
        if "node_modules" not in path.parts and path != Path(__file__).resolve()
    }


def fresh(kind: str) -> dict[str, dict[str, Any]]:
    return entries([a.abi for a in compile_contracts().values()], kind)


def test_every_abi_error_is_an_exception_of_its_name_and_signature() -> None:
    errors = fresh("error")
    assert set(errors) == set(reverts.REVERTS)
    for name, item in errors.items():
        cls = getattr(reverts, name)
        assert cls is reverts.REVERTS[name]
        assert cls.__name__ == name and cls.__module__ == "contracts.reverts"
        assert issubclass(cls, ContractRevert)
        assert signature(item) == cls.SIGNATURE  # type: ignore[attr-defined]


def test_every_abi_error_decodes_from_revert_data_into_its_exception() -> None:
    decode = decoder(compile_contracts())
    for name, item in fresh("error").items():
        types = [abi_type(i) for i in item["inputs"]]
        data = selector_of(item) + abi_encode(types, [sample(t) for t in types])
        error = decode.decode("0x" + data.hex())
        assert type(error) is reverts.REVERTS[name]
        assert error is not None and error.error_name == name
        assert list(error.error_args) == [i["name"] for i in item["inputs"]]


def test_every_error_python_imports_is_in_the_abi() -> None:
    used: set[str] = set()
    imports = r"^\s*from contracts\.reverts import (?:\(([^)]*)\)|([\w ,]+)$)"
    for text in python_sources().values():
        for grouped, inline in re.findall(imports, text, re.M):
            used |= set(re.findall(r"\w+", re.sub(r"#.*", "", grouped + inline)))
        used |= set(re.findall(r"\breverts\.([A-Z]\w+)", text))
    used -= {"REVERTS"}
    assert {"EscrowDealNotFound", "EscrowTaskAlreadySettled"} <= used  # the scan finds them
    assert used <= set(reverts.REVERTS), used - set(reverts.REVERTS)


def test_unknown_error_name_is_an_import_error() -> None:
    with pytest.raises(ImportError):
        from contracts.reverts import EscrowNoSuchError  # noqa: F401


def test_every_abi_event_decodes_by_its_abi_entry(deployed: World) -> None:
    bound = {"ComputeEscrow": deployed.escrow, "SettlementToken": deployed.token}
    artifacts = compile_contracts()
    decoded = set()
    for contract, binding in bound.items():
        for item in artifacts[contract].abi:
            if item["type"] != "event":
                continue
            indexed = [i for i in item["inputs"] if i["indexed"]]
            data = [i for i in item["inputs"] if not i["indexed"]]
            values = {i["name"]: sample(abi_type(i)) for i in item["inputs"]}
            log = {
                "address": binding.address,
                "topics": [HexBytes(topic(item))]
                + [HexBytes(abi_encode([abi_type(i)], [values[i["name"]]])) for i in indexed],
                "data": HexBytes(
                    abi_encode([abi_type(i) for i in data], [values[i["name"]] for i in data])
                ),
                "blockNumber": 1,
                "blockHash": HexBytes(b"\x00" * 32),
                "transactionHash": HexBytes(b"\x01" * 32),
                "transactionIndex": 0,
                "logIndex": 0,
            }
            assert binding.event_topic(item["name"]) == "0x" + topic(item).hex()
            (event,) = binding.decode_events([log])
            assert event.name == item["name"]
            assert set(event.args) == set(values)
            for name, value in values.items():
                got = event.args[name]
                want = value.lower() if isinstance(value, str) and value.startswith("0x") else value
                got = got.lower() if isinstance(got, str) else got
                assert (list(got) if isinstance(got, tuple) else got) == want, (item["name"], name)
            decoded.add(item["name"])
    assert decoded == set(fresh("event"))


def test_indexed_topic_is_the_abi_word_of_a_uint_or_an_address() -> None:
    assert indexed_topic(7) == "0x" + abi_encode(["uint256"], [7]).hex()
    owner = "0x" + "Ab" * 20
    assert indexed_topic(owner) == "0x" + abi_encode(["address"], [owner.lower()]).hex()


def test_every_event_python_reads_is_in_the_abi() -> None:
    events = fresh("event")
    patterns = (
        r"\.event\(\s*\"(\w+)\"",  # TxResult.event("DealOpened")
        r"event\.name\s*==\s*\"(\w+)\"",
        r"event_topic\(\s*\"(\w+)\"",
        r"\.events\.(\w+)\.topic",
        r"deal_logs\(\s*\w+,\s*\"(\w+)\"",
    )
    used: set[str] = set()
    for text in python_sources().values():
        for pattern in patterns:
            used |= set(re.findall(pattern, text))
        for group in re.findall(r"event\.name in \(([^)]*)\)", text):
            used |= set(re.findall(r"\"(\w+)\"", group))
    assert {"DealOpened", "VoucherRedeemed", "ReceiptsClaimed", "DealClosed"} <= used
    assert used <= set(events), used - set(events)


def test_event_topic_when_the_contract_has_no_such_event_then_key_error(deployed: World) -> None:
    with pytest.raises(KeyError):
        deployed.escrow.event_topic("DealReopened")
