"""Each signed message's layout has one source, `contracts/typed_data.json`, and every place
that repeats it (the Solidity struct, its type string, the calldata words and offsets that hash
it on chain, the Python dataclass, the domain version) is read as text and checked against it:
no compiler, no chain. A field inserted in the middle of the Receipt fails here, naming every
place that must follow, instead of as `EscrowInvalidSignature` in the slow suite.
"""

from __future__ import annotations

import dataclasses
import json
import re
import shutil
from pathlib import Path

import pytest

from contracts import eip712, layout
from contracts.eip712 import Domain
from contracts.hashing import keccak256
from contracts.layout import Sources

ESCROW = "0x" + "ab" * 20


def scratch(tmp_path: Path) -> Sources:
    """Return a copy of every source of the layout in `tmp_path` (the real files stay as they
    are)."""
    real = Sources()
    copies = {}
    for field in dataclasses.fields(Sources):
        original: Path = getattr(real, field.name)
        copy = tmp_path / f"{field.name}{original.suffix}"
        shutil.copyfile(original, copy)
        copies[field.name] = copy
    return Sources(**copies)


def test_every_signed_message_agrees_in_every_place() -> None:
    assert layout.check() == []


def test_domain_version_is_one_in_the_definition_the_contract_python_and_the_fingerprints() -> None:
    definition = json.loads(Sources().definition.read_text())
    version = definition["domain"]["version"]
    assert layout.escrow_domain(Sources().escrow_sol.read_text()) == ("ComputeEscrow", version)
    assert Domain(chain_id=1, verifying_contract=ESCROW).version == version
    recorded = json.loads(Sources().fingerprints.read_text())
    assert recorded["escrow"]["domain"] == definition["domain"]
    assert recorded["market"]["domain"] == definition["market"]["domain"]


def test_fingerprints_are_the_type_hashes_the_encoder_signs_with() -> None:
    recorded = json.loads(Sources().fingerprints.read_text())
    for section in ("escrow", "market"):
        for name, fingerprint in recorded[section]["messages"].items():
            assert fingerprint == "0x" + eip712.type_hash(name).hex(), name
            section_types = (
                eip712.definition()["market"]["types"]
                if section == "market"
                else eip712.definition()["types"]
            )
            assert layout.type_string(section_types, name) == eip712.type_string(name)


def _insert_in_receipt_struct(sources: Sources) -> None:
    """Insert `uint64 queuedMs` after `cacheHit` in the copy's Messages.sol Receipt."""
    text = sources.messages_sol.read_text()
    changed = text.replace(
        "    bool cacheHit;\n    uint64 deviceMs;",
        "    bool cacheHit;\n    uint64 queuedMs;\n    uint64 deviceMs;",
    )
    assert changed != text
    sources.messages_sol.write_text(changed)


def _insert_in_receipt_definition(sources: Sources) -> None:
    """Insert `uint64 queuedMs` after `cacheHit` in the copy's typed_data.json Receipt."""
    definition = json.loads(sources.definition.read_text())
    for types in (definition["types"], definition["messages"]["Receipt"]["typedData"]["types"]):
        at = [m["name"] for m in types["Receipt"]].index("cacheHit") + 1
        types["Receipt"].insert(at, {"name": "queuedMs", "type": "uint64"})
    sources.definition.write_text(json.dumps(definition, indent=2))


def _assert_names_every_place(problems: list[str], name: str) -> str:
    [message] = [p for p in problems if p.startswith(f"{name}: ")]
    for place in layout.places(name, market=False):
        assert place in message
    for file in ("Messages.sol", "MessageHashing.sol", "typed_data.json", "messages.py"):
        assert file in message
    assert 'EIP712("ComputeEscrow", "N")' in message and "domain.version" in message
    return message


def test_field_inserted_in_the_middle_of_the_receipt_struct_fails_naming_every_place(
    tmp_path: Path,
) -> None:
    sources = scratch(tmp_path)
    _insert_in_receipt_struct(sources)
    problems = layout.check(sources)
    message = _assert_names_every_place(problems, "Receipt")
    print("\n" + "\n".join(problems))
    assert "Messages.sol struct Receipt" in message and "queuedMs" in message


def test_field_inserted_in_the_middle_of_the_receipt_definition_fails_naming_every_place(
    tmp_path: Path,
) -> None:
    sources = scratch(tmp_path)
    _insert_in_receipt_definition(sources)
    problems = layout.check(sources)
    message = _assert_names_every_place(problems, "Receipt")
    print("\n" + "\n".join(problems))
    for found in (
        "Messages.sol struct Receipt",  # the struct lags
        "MessageHashing.sol type string",  # so does RECEIPT_TYPEHASH
        "RECEIPT_WORDS = 15, but Receipt has 16 fields",  # the word count
        "requestHash copies",  # programHash, inputHash and deadline moved a word
        "'Receipt words' comment",
        "messages.py Receipt declares",  # the dataclass lags
        f"the escrow domain version is still {VERSION}",  # and the version did not move
    ):
        assert found in message, found


VERSION = json.loads(Sources().definition.read_text())["domain"]["version"]
NEXT = str(int(VERSION) + 1)


def _move_contract_version(sources: Sources) -> None:
    text = sources.escrow_sol.read_text()
    moved = text.replace(
        f'EIP712("ComputeEscrow", "{VERSION}")', f'EIP712("ComputeEscrow", "{NEXT}")'
    )
    assert moved != text
    sources.escrow_sol.write_text(moved)


def test_moved_domain_version_without_recorded_fingerprints_fails(tmp_path: Path) -> None:
    sources = scratch(tmp_path)
    _insert_in_receipt_definition(sources)
    definition = json.loads(sources.definition.read_text())
    definition["domain"]["version"] = "3"
    sources.definition.write_text(json.dumps(definition))
    sources.escrow_sol.write_text(
        sources.escrow_sol.read_text().replace(
            'EIP712("ComputeEscrow", "2")', 'EIP712("ComputeEscrow", "3")'
        )
    )
    message = _assert_names_every_place(layout.check(sources), "Receipt")
    assert "record the fingerprint" in message and "still" not in message
    layout.record(sources)
    assert "record the fingerprint" not in "".join(layout.check(sources))


def test_domain_version_in_the_contract_alone_moved_then_named(tmp_path: Path) -> None:
    sources = scratch(tmp_path)
    sources.escrow_sol.write_text(
        sources.escrow_sol.read_text().replace(
            'EIP712("ComputeEscrow", "2")', 'EIP712("ComputeEscrow", "3")'
        )
    )
    [message] = layout.check(sources)
    assert (
        "ComputeEscrow.sol EIP712('ComputeEscrow', '3') != typed_data ('ComputeEscrow', '2')"
        in message
    )


@pytest.mark.parametrize(
    ("before", "after", "named"),
    [
        ("add(receipt, 0x180), 0x20)", "add(receipt, 0x1a0), 0x20)", "requestHash copies"),
        ("RECEIPT_WORDS = 15;", "RECEIPT_WORDS = 14;", "RECEIPT_WORDS = 14"),
        ("QUOTE_HEAD_WORDS = 11;", "QUOTE_HEAD_WORDS = 12;", "QUOTE_HEAD_WORDS = 12"),
        ("keccak256(m, 0x100)", "keccak256(m, 0xe0)", "requestHash hashes 224 bytes"),
        ("uint64 finishedAt,uint64 deadline", "uint64 deadline,uint64 finishedAt", "type string"),
    ],
)
def test_hand_counted_hashing_when_off_then_named(
    tmp_path: Path, before: str, after: str, named: str
) -> None:
    sources = scratch(tmp_path)
    text = sources.hashing_sol.read_text()
    assert before in text
    sources.hashing_sol.write_text(text.replace(before, after, 1))
    problems = layout.check(sources)
    assert problems and named in "".join(problems)
    assert all("every place that must follow" in p for p in problems)


def test_type_string_matches_keccak_of_the_solidity_constant() -> None:
    strings = layout.type_strings(Sources().hashing_sol.read_text())
    for name, text in strings.items():
        assert keccak256(text.encode()) == eip712.type_hash(name), name
    assert re.fullmatch(r"\w+", "".join(strings))
