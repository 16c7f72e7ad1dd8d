"""Every signed message's layout, checked in each place it lives against `typed_data.json`.

A signed message lives in six places: its definition (`contracts/typed_data.json`), the Solidity
struct (`contracts/sol/types/Messages.sol`), the type string and the hand-counted calldata words
and offsets that hash it on chain (`contracts/sol/libraries/MessageHashing.sol`), the Python
dataclass (`contracts/messages.py`, `contracts/orders.py`) and the EIP-712 domain version that
must move when any of them does (`EIP712("ComputeEscrow", "N")` in `ComputeEscrow.sol`, the
definition's `domain.version`). `check(sources)` reads them as text (no compiler, no chain) and
returns every disagreement, each with the list of places to follow; `contracts/
message_fingerprints.json` holds the keccak256 of each message's type string next to its
domain's version, so changing a message without moving the version fails too. After a change
that moves the version, `python -m contracts.layout --record` records the new fingerprints.
"""

from __future__ import annotations

import ast
import json
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from contracts.hashing import keccak256

ROOT = Path(__file__).resolve().parent
WORD = 0x20
ONE_WORD = re.compile(r"uint\d+|address|bool|bytes32")
"""Types a message hashed by copying calldata may hold: each is one static word."""
STATIC = ("Plan", "TaskRequest", "Ack", "Receipt")
"""Messages `MessageHashing` hashes by copying their calldata words (Quote: its head words)."""
FROM_MAX_PRICE = "maxPrice"
"""The one TaskRequest field `requestHash` takes from its argument, not from the Receipt."""


@dataclass(frozen=True)
class Sources:
    """The files that hold a signed message (defaults: the repository's)."""

    definition: Path = ROOT / "typed_data.json"
    messages_sol: Path = ROOT / "sol" / "types" / "Messages.sol"
    hashing_sol: Path = ROOT / "sol" / "libraries" / "MessageHashing.sol"
    escrow_sol: Path = ROOT / "sol" / "ComputeEscrow.sol"
    messages_py: Path = ROOT / "messages.py"
    orders_py: Path = ROOT / "orders.py"
    fingerprints: Path = ROOT / "message_fingerprints.json"


def places(name: str, market: bool) -> list[str]:
    """Return every place that must follow a change to message `name`, in the order to edit."""
    if market:
        return [
            f"contracts/typed_data.json: market.types.{name} and market.messages.{name}",
            f"contracts/orders.py: the {name} dataclass, the same fields in order (snake_case)",
            "the market domain version: market.domain.version in contracts/typed_data.json",
            "contracts/message_fingerprints.json: `python -m contracts.layout --record`",
        ]
    upper = re.sub(r"(?<!^)([A-Z])", r"_\1", name).upper()
    hashing = f"{upper}_TYPEHASH's type string"
    if name in STATIC:
        hashing += f", {upper}_WORDS"
    if name == "Quote":
        hashing += ", QUOTE_HEAD_WORDS (the words before its plan)"
    if name in ("Receipt", "TaskRequest"):
        hashing += ", and requestHash's calldata offsets (its 'Receipt words' comment too)"
    return [
        f"contracts/typed_data.json: types.{name} and messages.{name} (the definition)",
        f"contracts/sol/types/Messages.sol: struct {name}, the same fields in order",
        f"contracts/sol/libraries/MessageHashing.sol: {hashing}",
        f"contracts/messages.py: the {name} dataclass, the same fields in order (snake_case)",
        'the domain version: EIP712("ComputeEscrow", "N") in contracts/sol/ComputeEscrow.sol '
        "and domain.version in contracts/typed_data.json, moved together",
        "contracts/message_fingerprints.json: `python -m contracts.layout --record`",
    ]


# ---- reading each place ----------------------------------------------------------------------


def solidity_structs(source: str) -> dict[str, list[tuple[str, str]]]:
    """Return the structs of a Solidity file: name -> [(field, type)], in order."""
    structs = {}
    for name, body in re.findall(r"struct (\w+) \{(.*?)\}", source, re.S):
        lines = (re.sub(r"//.*", "", line).strip() for line in body.splitlines())
        structs[name] = [
            (m[2], m[1]) for line in lines if (m := re.fullmatch(r"([\w\[\]]+) (\w+);", line))
        ]
    return structs


def _constants(source: str) -> dict[str, str]:
    """Return the string constants of a Solidity file, the constants they concatenate resolved."""
    found: dict[str, str] = {}
    for name, expression in re.findall(r"constant (\w+)\s*=\s*(.*?);", source, re.S):
        parts = re.findall(r'"([^"]*)"|\b([A-Z][A-Z0-9_]+)\b', expression)
        found[name] = "".join(text or found.get(ref, "") for text, ref in parts)
    return found


def type_strings(source: str) -> dict[str, str]:
    """Return the type string behind each `*_TYPEHASH` of `MessageHashing.sol`, by struct."""
    return {
        "".join(w.title() for w in name.removesuffix("_TYPEHASH").split("_")): text
        for name, text in _constants(source).items()
        if name.endswith("_TYPEHASH")
    }


def word_counts(source: str) -> dict[str, int]:
    """Return the `*_WORDS` constants of `MessageHashing.sol` by name."""
    return {n: int(v) for n, v in re.findall(r"constant (\w+_WORDS)\s*=\s*(\d+);", source)}


def _function(source: str, signature: str) -> str:
    """Return the body of the function whose header holds `signature` ('' if none)."""
    start = source.find(signature)
    if start < 0:
        return ""
    depth, i = 0, source.index("{", start)
    for j in range(i, len(source)):
        depth += {"{": 1, "}": -1}.get(source[j], 0)
        if depth == 0:
            return source[i : j + 1]
    return source[i:]


def request_words(source: str) -> tuple[dict[int, str], int | None, list[str]]:
    """Read `requestHash(Receipt, maxPrice)`: the source of each TaskRequest word it hashes
    (`receipt:<word>` or `maxPrice`), the bytes it hashes, and its 'Receipt words' comment."""
    body = _function(source, "function requestHash(Receipt calldata receipt")
    words: dict[int, str] = {}
    for dst, src, size in re.findall(
        r"calldatacopy\(add\(m, (0x[0-9a-f]+)\), (receipt|add\(receipt, 0x[0-9a-f]+\)), "
        r"(0x[0-9a-f]+)\)",
        body,
    ):
        offset = int(m[0], 16) if (m := re.search(r"0x[0-9a-f]+", src)) else 0
        for k in range(int(size, 16) // WORD):
            words[int(dst, 16) // WORD - 1 + k] = f"receipt:{offset // WORD + k}"
    for dst in re.findall(r"mstore\(add\(m, (0x[0-9a-f]+)\), maxPrice\)", body):
        words[int(dst, 16) // WORD - 1] = FROM_MAX_PRICE
    total = re.search(r"keccak256\(m, (0x[0-9a-f]+)\)", body)
    comment = re.search(r"Receipt words: ([^\n]*)\.", body)
    named = re.findall(r"(\d+ \w+)", comment[1]) if comment else []
    return words, int(total[1], 16) if total else None, named


def hash_constants(source: str, name: str) -> tuple[str, ...]:
    """Return the `*_TYPEHASH` and `*_WORDS` constants `hash(<name> calldata ...)` uses."""
    body = _function(source, f"function hash({name} calldata")
    return tuple(sorted(set(re.findall(r"\b([A-Z][A-Z_]*_(?:TYPEHASH|WORDS))\b", body))))


def dataclass_fields(source: str) -> dict[str, list[str]]:
    """Return the fields of each Message dataclass of a Python file: TYPE_NAME -> [field]."""
    found: dict[str, list[str]] = {}
    for node in ast.parse(source).body:
        if not isinstance(node, ast.ClassDef):
            continue
        type_name, names = None, []
        for item in node.body:
            if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                if item.target.id == "TYPE_NAME" and isinstance(item.value, ast.Constant):
                    type_name = str(item.value.value)
                elif "ClassVar" not in ast.unparse(item.annotation):
                    names.append(item.target.id)
        if type_name is not None:
            found[type_name] = names
    return found


def escrow_domain(source: str) -> tuple[str, str] | None:
    """Return the (name, version) of `EIP712("name", "version")` in `ComputeEscrow.sol`."""
    found = re.search(r'EIP712\("([^"]*)",\s*"([^"]*)"\)', source)
    return (found[1], found[2]) if found else None


# ---- the definition's view -------------------------------------------------------------------


def _show(fields: list[tuple[str, str]] | None) -> str:
    return "missing" if fields is None else ", ".join(f"{k} {f}" for f, k in fields)


def _fields(types: dict[str, Any], name: str) -> list[tuple[str, str]]:
    return [(str(m["name"]), str(m["type"])) for m in types[name]]


def type_string(types: dict[str, Any], name: str) -> str:
    """Return EIP-712's type string of `name` under `types` (referred structs sorted, appended)."""
    seen: set[str] = set()
    stack = [name]
    while stack:
        for _, kind in _fields(types, stack.pop()):
            base = kind.removesuffix("[]")
            if base in types and base not in seen and base != name:
                seen.add(base)
                stack.append(base)

    def one(struct: str) -> str:
        return f"{struct}({','.join(f'{k} {f}' for f, k in _fields(types, struct))})"

    return "".join(one(s) for s in (name, *sorted(seen)))


def attribute(field: str) -> str:
    """Return the snake_case attribute of a camelCase field."""
    return re.sub(r"([A-Z])", r"_\1", field).lower()


def fingerprints(definition: dict[str, Any]) -> dict[str, Any]:
    """Return each domain's version and the keccak256 of each of its messages' type strings."""
    out: dict[str, Any] = {}
    for key, section in (("escrow", definition), ("market", definition["market"])):
        types = section["types"]
        out[key] = {
            "domain": dict(section["domain"]),
            "messages": {
                name: "0x" + keccak256(type_string(types, name).encode()).hex()
                for name in sorted(types)
                if name != "EIP712Domain"
            },
        }
    return out


# ---- the check -------------------------------------------------------------------------------


def _static_checks(name: str, fields: list[tuple[str, str]], hashing: str) -> list[str]:
    problems = []
    counts = word_counts(hashing)
    upper = re.sub(r"(?<!^)([A-Z])", r"_\1", name).upper()
    if name in STATIC:
        wide = [f"{f} {k}" for f, k in fields if not ONE_WORD.fullmatch(k)]
        if wide:
            problems.append(f"{name} is hashed from calldata words, but {wide} is not one word")
        if counts.get(f"{upper}_WORDS") != len(fields):
            problems.append(
                f"MessageHashing.sol {upper}_WORDS = {counts.get(f'{upper}_WORDS')}, "
                f"but {name} has {len(fields)} fields"
            )
        used = hash_constants(hashing, name)
        if used != tuple(sorted((f"{upper}_TYPEHASH", f"{upper}_WORDS"))):
            problems.append(f"MessageHashing.sol hash({name}) uses {list(used)}")
    if name == "Quote":
        head = [f for f, k in fields if ONE_WORD.fullmatch(k)]
        if fields[-1][1] != "Plan" or len(head) != len(fields) - 1:
            problems.append("Quote is hashed as its one-word fields, then its plan, last")
        if counts.get("QUOTE_HEAD_WORDS") != len(fields) - 1:
            problems.append(
                f"MessageHashing.sol QUOTE_HEAD_WORDS = {counts.get('QUOTE_HEAD_WORDS')}, "
                f"but Quote has {len(fields) - 1} fields before its plan"
            )
    return problems


def _request_checks(types: dict[str, Any], hashing: str) -> list[str]:
    receipt, request = _fields(types, "Receipt"), _fields(types, "TaskRequest")
    index = {f: (i, k) for i, (f, k) in enumerate(receipt)}
    words, total, named = request_words(hashing)
    expected: dict[int, str] = {}
    for i, (field, kind) in enumerate(request):
        if field == FROM_MAX_PRICE:
            expected[i] = FROM_MAX_PRICE
        elif index.get(field, (None, None))[1] == kind:
            expected[i] = f"receipt:{index[field][0]}"
        else:
            expected[i] = f"(no Receipt field {kind} {field})"
    problems = []
    if words != expected:
        show = {request[i][0]: words.get(i) for i in range(len(request))}
        want = {request[i][0]: v for i, v in expected.items()}
        problems.append(f"MessageHashing.sol requestHash copies {show}, the definition: {want}")
    if total != WORD * (len(request) + 1):
        problems.append(
            f"MessageHashing.sol requestHash hashes {total} bytes, the definition "
            f"{WORD * (len(request) + 1)} (type hash and {len(request)} fields)"
        )
    comment = [f"{index[f][0]} {f}" for f, _ in request if f in index]
    if named != comment:
        problems.append(f"MessageHashing.sol 'Receipt words' comment says {named}, not {comment}")
    return problems


def check(sources: Sources | None = None) -> list[str]:
    """Return every disagreement between the places of every signed message, each with the
    places that must follow it ([] when they all agree)."""
    src = sources or Sources()
    definition: dict[str, Any] = json.loads(src.definition.read_text())
    hashing = src.hashing_sol.read_text()
    structs = solidity_structs(src.messages_sol.read_text())
    strings = type_strings(hashing)
    classes = dataclass_fields(src.messages_py.read_text())
    classes |= dataclass_fields(src.orders_py.read_text())
    recorded = json.loads(src.fingerprints.read_text())
    now = fingerprints(definition)
    by_message: dict[tuple[str, bool], list[str]] = {}

    def report(name: str, market: bool, problem: str) -> None:
        by_message.setdefault((name, market), []).append(problem)

    types = definition["types"]
    for name in (n for n in types if n != "EIP712Domain"):
        fields = _fields(types, name)
        if structs.get(name) != fields:
            report(
                name,
                False,
                f"Messages.sol struct {name} ({_show(structs.get(name))}) is not the "
                f"definition's ({_show(fields)})",
            )
        if strings.get(name) != type_string(types, name):
            report(
                name,
                False,
                f"MessageHashing.sol type string {strings.get(name)!r} is not the "
                f"definition's {type_string(types, name)!r}",
            )
        published = definition["messages"].get(name, {}).get("typedData", {}).get("types", {})
        if name in definition["messages"] and published.get(name) != types[name]:
            report(name, False, f"typed_data.json messages.{name} differs from types.{name}")
        for problem in _static_checks(name, fields, hashing):
            report(name, False, problem)
    for problem in _request_checks(types, hashing):
        report("Receipt", False, problem)
    for key, market in (("escrow", False), ("market", True)):
        section = definition["market"] if market else definition
        for name in (n for n in section["types"] if n != "EIP712Domain"):
            want = [attribute(f) for f, _ in _fields(section["types"], name)]
            if classes.get(name) != want:
                place = "orders.py" if market else "messages.py"
                report(name, market, f"{place} {name} declares {classes.get(name)}, not {want}")
        old, new = recorded[key], now[key]
        for name in sorted(set(old["messages"]) | set(new["messages"])):
            if old["messages"].get(name) == new["messages"].get(name):
                continue
            if old["domain"]["version"] == new["domain"]["version"]:
                report(
                    name,
                    market,
                    f"{name}'s type changed but the {key} domain version is still "
                    f"{new['domain']['version']}: signatures under the old layout would verify",
                )
            else:
                report(name, market, f"{name} changed with the version: record the fingerprint")
    domain = (definition["domain"]["name"], definition["domain"]["version"])
    found = escrow_domain(src.escrow_sol.read_text())
    if found != domain:
        report("EIP712Domain", False, f"ComputeEscrow.sol EIP712{found} != typed_data {domain}")
    return [
        f"{name}: its layout differs between the places that hold it:\n"
        + "\n".join(f"  * {p}" for p in problems)
        + "\n  every place that must follow:\n"
        + "\n".join(f"  - {p}" for p in places(name, market))
        for (name, market), problems in sorted(by_message.items())
    ]


def record(sources: Sources | None = None) -> None:
    """Write the fingerprints of the definition's messages (after moving the domain version)."""
    src = sources or Sources()
    definition = json.loads(src.definition.read_text())
    src.fingerprints.write_text(json.dumps(fingerprints(definition), indent=2) + "\n")


def main(argv: Sequence[str]) -> int:
    """`--record`: write the fingerprints; otherwise print every disagreement (exit 1 if any)."""
    if list(argv) == ["--record"]:
        record()
        return 0
    problems = check()
    print("\n".join(problems) or "every signed message agrees in every place")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
