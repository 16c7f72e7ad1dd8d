"""The checkable claims of README.md and docs/*.md against the code that defines them.

Each check reads a document and its source of truth and returns what disagrees, so a test fails
naming the sentence that drifted: signed messages' fields and domain versions from
`contracts/typed_data.json`; instants and constants from the Solidity source text; gas figures
from `contracts/gas-snapshot.json`; configuration keys and defaults from the settings models; CLI
flags from the `tpumarket` parsers, built as `contracts.cli.main` builds them (the entry points
of every package). Every check is also run once on a drifted copy of its document, which it must
refuse, so a check that silently stopped matching its sentence fails too. Nothing here starts a
component: it reads files and imports modules.
"""

from __future__ import annotations

import argparse
import functools
import importlib
import json
import re
from collections.abc import Callable, Iterator
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
ALL_DOCS = [README, *DOCS]
SETTLEMENT = ROOT / "docs" / "settlement.md"
PROVIDER_API = ROOT / "docs" / "provider-api.md"
KEY_SOURCES = {"private_key_file", "keystore", "passphrase_file"}
"""Provider config keys that only say where the key comes from (read into `private_key`)."""
TYPED_DATA = json.loads((ROOT / "contracts" / "typed_data.json").read_text())
GAS = json.loads((ROOT / "contracts" / "gas-snapshot.json").read_text())
ESCROW_SOL = (ROOT / "contracts" / "sol" / "ComputeEscrow.sol").read_text()
SOLIDITY = {p: p.read_text() for p in sorted((ROOT / "contracts" / "sol").rglob("*.sol"))}


def _doc(path: Path) -> str:
    return path.read_text()


def _flat(text: str) -> str:
    """The text with every run of white space one blank (sentences wrap across lines)."""
    return re.sub(r"\s+", " ", text)


def _number(text: str) -> int:
    return int(text.replace(",", "").replace("_", ""))


# --- signed messages: fields and domains (contracts/typed_data.json) -----------------------


def _message_fields() -> dict[str, list[str]]:
    out = {}
    for messages in (TYPED_DATA["messages"], TYPED_DATA["market"]["messages"]):
        for name, message in messages.items():
            typed = message["typedData"]
            out[name] = [f["name"] for f in typed["types"][typed["primaryType"]]]
    return out


FIELDS = _message_fields()
DOMAINS = {
    "ComputeEscrow": TYPED_DATA["domain"]["version"],
    "tpumarket-market": TYPED_DATA["market"]["domain"]["version"],
}


def _split_top(text: str) -> list[str]:
    """Split at commas outside parentheses."""
    parts, depth, current = [], 0, ""
    for char in text:
        depth += (char == "(") - (char == ")")
        if char == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += char
    return [*parts, current]


def _first_names(items: str) -> list[str]:
    """The first identifier of each comma-separated item (annotations and bold dropped)."""
    names = []
    for item in _split_top(items):
        match = re.search(r"[A-Za-z_]\w*", item.replace("*", "").replace("`", ""))
        names.append(match.group(0) if match else "")
    return names


def check_message_fields(text: str) -> list[str]:
    """Every place a doc lists a signed message's fields lists exactly its fields, in order:
    `Name(a, b)`, a `Name` (`a`, `b`) list, and a `| `Name` | ... | a, b |` table row."""
    problems = []
    flat = _flat(text)
    names = "|".join(FIELDS)
    for match in re.finditer(rf"`({names})\(([^)`]*(?:\([^)`]*\)[^)`]*)*)\)`", flat):
        name, got = match.group(1), _first_names(match.group(2))
        if got != FIELDS[name]:
            problems.append(f"`{name}(...)` lists {got}, typed_data.json {FIELDS[name]}")
    for match in re.finditer(rf"`({names})` \(((?:`\w+`, )+`\w+`)", flat):
        name, got = match.group(1), re.findall(r"`(\w+)`", match.group(2))
        if got != FIELDS[name]:
            problems.append(f"`{name}` (...) lists {got}, typed_data.json {FIELDS[name]}")
    previous: list[str] = []
    for line in text.splitlines():
        row = re.match(rf"\| `({names})` \|(?: [\w ]+ \|)? (.*) \|$", line)
        if row is None:
            continue
        name, cell = row.group(1), row.group(2)
        same = re.match(r"the same \+ `(\w+)`", cell)
        got = [*previous, same.group(1)] if same else _first_names(cell.split(" — ")[0])
        previous = got
        if got != FIELDS[name]:
            problems.append(f"table row `{name}` lists {got}, typed_data.json {FIELDS[name]}")
    return problems


def check_domain_versions(text: str) -> list[str]:
    """Every domain a doc names, (`ComputeEscrow`, `2`, ...) or "domain version", has the
    version typed_data.json gives it."""
    problems = []
    flat = _flat(text)
    said = [
        (m.group(1), m.group(2))
        for m in re.finditer(r"[`\"](ComputeEscrow|tpumarket-market)[`\"], [`\"](\w+)[`\"]", flat)
    ]
    said += [
        ("ComputeEscrow", v) for v in re.findall(r"domain `ComputeEscrow` version `(\w+)`", flat)
    ]
    said += [
        ("ComputeEscrow", v)
        for v in re.findall(r"escrow v\d+ \(EIP-712 domain version \"(\w+)\"", flat)
    ]
    for name, version in said:
        if version != DOMAINS[name]:
            problems.append(f"domain {name} version {version}: typed_data.json has {DOMAINS[name]}")
    return problems


# --- instants and constants (Solidity source text) ------------------------------------------


def _solidity_constants() -> dict[str, int]:
    units = {"": 1, "seconds": 1, "minutes": 60, "hours": 3600, "days": 86_400, "weeks": 604_800}
    out = {}
    for source in SOLIDITY.values():
        for m in re.finditer(r"constant ([A-Z][A-Z0-9_]*) = ([0-9_]+)\s*(\w*);", source):
            if m.group(3) in units:
                out[m.group(1)] = _number(m.group(2)) * units[m.group(3)]
    return out


CONSTANTS = _solidity_constants()
CLOSABLE = re.search(r"closableAt = deal\.expiry \+ (\d+) \* window;", ESCROW_SOL)
SETTLE_BY = re.search(
    r"function _settleBy\(uint256 deadline, uint256 expiry, uint256 window\)[^{]*\{\s*"
    r"return \(deadline < expiry \? deadline : expiry\) \+ window;",
    ESCROW_SOL,
)


def unilateral_close_windows() -> int:
    """How many challenge windows past its expiry a deal closes alone, read from `closeDeal`."""
    assert CLOSABLE is not None, "closeDeal no longer reads `closableAt = deal.expiry + N * window`"
    return int(CLOSABLE.group(1))


def check_instants(text: str) -> list[str]:
    """A deal closes alone from `expiry + N * challengeWindow` with the contract's N, never
    `expiry + challengeWindow`; every `settleBy = min(deadline, expiry) + challengeWindow`."""
    problems = []
    flat = _flat(text)
    windows = unilateral_close_windows()
    for m in re.finditer(r"expiry \+ (?:(\d+) ?[*\u00d7] ?)?(?:deal\.)?challenge_?[wW]indow", flat):
        if m.group(1) is None or int(m.group(1)) != windows:
            problems.append(
                f"{m.group(0)!r}: closeDeal closes alone from expiry + {windows} windows"
            )
    assert SETTLE_BY is not None, (
        "the escrow's _settleBy no longer reads min(deadline, expiry) + window"
    )
    for m in re.finditer(r"settleBy(?:\(task\))? = min\(([^)]*)\) \+ (\w+)", flat):
        args = [
            a.strip().removeprefix("request.").removeprefix("deal.") for a in m.group(1).split(",")
        ]
        if args != ["deadline", "expiry"] or m.group(2) not in (
            "challengeWindow",
            "challenge_window",
        ):
            problems.append(
                f"{m.group(0)!r}: the escrow's settleBy is min(deadline, expiry) + window"
            )
    return problems


def check_constants(text: str) -> list[str]:
    """Every Solidity constant a doc quotes (`NAME` = 65,536 or `NAME` (2)) has its value, and a
    `python.module.NAME` = N its module's."""
    problems = []
    flat = _flat(text)
    for m in re.finditer(r"`([A-Z][A-Z0-9_]{3,})` (?:= |\()([0-9][0-9,_]*)", flat):
        name, said = m.group(1), _number(m.group(2))
        if name in CONSTANTS and CONSTANTS[name] != said:
            problems.append(f"`{name}` said {said}: the contract has {CONSTANTS[name]}")
    for m in re.finditer(r"`((?:[a-z_]+\.)+)([A-Z][A-Z0-9_]+)` = ([0-9][0-9,_]*)", flat):
        module = __import__(m.group(1).rstrip("."), fromlist=[m.group(2)])
        actual = getattr(module, m.group(2))
        if actual != _number(m.group(3)):
            problems.append(f"`{m.group(1)}{m.group(2)}` said {m.group(3)}: it is {actual}")
    if "seven days" in flat and CONSTANTS["DEFAULT_ARBITRATION_PERIOD"] != 7 * 86_400:
        problems.append("'seven days': DEFAULT_ARBITRATION_PERIOD is no longer 7 days")
    return problems


# --- gas figures (contracts/gas-snapshot.json) ------------------------------------------------

SETTLEMENT_GAS_ROWS = {
    "one voucher paying 100 tasks, per task": "coop_gas_per_task_100",
    "claim of 100 receipts in one batch, per task": "claim_gas_per_task_100",
    "claim of 1 receipt": "claim_gas_per_task_1",
    "refund_breach": "refund_breach",
    "open_deal": "open_deal",
    "close_deal (the second agreement)": "close_deal",
}
"""docs/settlement.md's gas table: row label -> snapshot key (its last column is the snapshot)."""


def check_readme_gas(text: str) -> list[str]:
    """README's voucher cost per task at 100 is the snapshot's `coop_gas_per_task_100`."""
    said = re.findall(r"about ([0-9,]+) gas per task at 100", _flat(text))
    want = GAS["coop_gas_per_task_100"]
    if not said:
        return ["README no longer gives the voucher's gas per task at 100"]
    return [f"README says {s} gas per task: snapshot {want}" for s in said if _number(s) != want]


def _rows(text: str, heading: str) -> Iterator[list[str]]:
    """The body rows of the first table at or after `heading` (a table's own header line, or a
    line above the table), up to the table's end."""
    lines = text[text.index(heading) :].splitlines()
    started = lines[0].startswith("|")
    for line in lines[1:]:
        if not line.startswith("|"):
            if started:
                return
            continue
        if started and not line.startswith("|---"):
            yield [c.strip() for c in line.strip().strip("|").split("|")]
        started = True


def check_settlement_gas(text: str) -> list[str]:
    """docs/settlement.md's gas table: its last column is the snapshot, row by row."""
    problems, seen = [], set()
    for cells in _rows(text, "Gas, from `scripts/bench-gas`"):
        key = SETTLEMENT_GAS_ROWS.get(cells[0])
        if key is None:
            continue
        seen.add(key)
        said = _number(re.match(r"[0-9,]+", cells[-1]).group(0))  # type: ignore[union-attr]
        if said != GAS[key]:
            problems.append(f"settlement.md {cells[0]!r}: {said}, snapshot {key} = {GAS[key]}")
    missing = set(SETTLEMENT_GAS_ROWS.values()) - seen
    return problems + [f"settlement.md's gas table lost its {k} row" for k in sorted(missing)]


def check_benchmarks_gas(text: str) -> list[str]:
    """docs/benchmarks.md's settlement table: its first figure column is the snapshot, every key."""
    problems, seen = [], set()
    for cells in _rows(text, "| key | v2 gas (`contracts/gas-snapshot.json`)"):
        if cells[0] not in GAS:
            continue
        seen.add(cells[0])
        said = _number(cells[1].strip("*"))
        if said != GAS[cells[0]]:
            problems.append(f"benchmarks.md {cells[0]}: {said}, snapshot {GAS[cells[0]]}")
    return problems + [f"benchmarks.md's gas table lacks {k}" for k in sorted(set(GAS) - seen)]


# --- configuration keys (the settings models) -------------------------------------------------


def _doc_default(cell: str) -> Any:
    cell = cell.strip("`")
    if cell in ("required", "none", "[]", "true", "false"):
        return {"required": "required", "none": None, "[]": (), "true": True, "false": False}[cell]
    if cell.startswith('"'):
        return cell.strip('"')
    try:
        return float(cell)
    except ValueError:
        return cell


BUILT = object()


def _model_default(field: Any) -> Any:
    from pydantic_core import PydanticUndefined

    if field.is_required():
        return "required"
    if field.default is PydanticUndefined:
        return BUILT  # a section or the plan, built by its factory: the doc names its table
    default = field.default
    return (
        float(default)
        if isinstance(default, int | float) and not isinstance(default, bool)
        else default
    )


def check_provider_config(text: str) -> list[str]:
    """docs/provider-api.md's key tables: every key of ProviderConfig and of each section, with
    its default, and no key the models lack."""
    from provider.config import ProviderConfig
    from provider.config_sections import AskConfig, HttpConfig, SettlementConfig

    config_source = (ROOT / "provider" / "config.py").read_text()
    problems = []
    tables: list[tuple[str, type[Any], set[str]]] = [
        ("| key | default | what |", ProviderConfig, KEY_SOURCES),
        ("| `[settlement]` key |", SettlementConfig, set()),
        ("| `[http]` key |", HttpConfig, set()),
        ("| `[ask]` key |", AskConfig, set()),
    ]
    section = text[text.index("## Configuration") :]
    for heading, model, extra in tables:
        if heading not in section:
            problems.append(f"provider-api.md has no table {heading!r}")
            continue
        rows = {c[0].strip("`"): c[1] for c in _rows(section, heading)}
        fields = {(f.alias or n): f for n, f in model.model_fields.items()}
        for key in sorted((set(fields) | extra) - set(rows)):
            problems.append(f"{model.__name__}.{key} is not in provider-api.md's {heading!r}")
        for key, cell in rows.items():
            if key in extra:
                if key not in config_source:
                    problems.append(
                        f"provider-api.md documents {key}, which provider/config.py lacks"
                    )
                continue
            if key not in fields:
                problems.append(f"provider-api.md documents {key}, which {model.__name__} lacks")
                continue
            want = _model_default(fields[key])
            if want is not BUILT and _doc_default(cell) != want:
                problems.append(f"{model.__name__}.{key}: doc default {cell}, model {want!r}")
    return problems


def _toml_blocks(text: str) -> Iterator[str]:
    """The ```toml blocks of a doc and the provider.toml a shell block writes (a heredoc)."""
    yield from re.findall(r"^```toml\n(.*?)^```$", text, re.S | re.M)
    yield from re.findall(r"<<'TOML'\n(.*?)^TOML$", text, re.S | re.M)


def check_provider_toml(text: str) -> list[str]:
    """Every key of every provider.toml a doc shows is a key the daemon's config takes."""
    import dataclasses
    import tomllib

    from contracts.messages import Plan
    from provider.config import ProviderConfig
    from provider.config_sections import AskConfig, HttpConfig, SettlementConfig

    def keys(model: type[Any]) -> set[str]:
        return {f.alias or n for n, f in model.model_fields.items()}

    known = {
        "": keys(ProviderConfig) | KEY_SOURCES,
        "plan": {f.name for f in dataclasses.fields(Plan)},
        "settlement": keys(SettlementConfig),
        "http": keys(HttpConfig),
        "ask": keys(AskConfig),
    }
    problems = []
    for block in _toml_blocks(text):
        for key, value in tomllib.loads(block).items():
            tables = value.items() if isinstance(value, dict) else [(key, value)]
            section = key if isinstance(value, dict) else ""
            if section not in known:
                problems.append(f"provider.toml has no [{section}] table")
                continue
            for name, _ in tables:
                if name not in known[section]:
                    problems.append(f"provider.toml key {section or 'top'}.{name} is no config key")
    return problems


def check_market_settings(text: str) -> list[str]:
    """docs/market.md's settings table: one row per field of market.settings.Settings, its
    variable, default and older names as the model reads them."""
    from market.settings import PREFIX, Settings

    problems = []
    rows = {c[0].strip("`"): c[1:] for c in _rows(text, "| Variable | Default |")}
    expected = set()
    for name, field in Settings.model_fields.items():
        variable = PREFIX + name.upper()
        expected.add(variable)
        if variable not in rows:
            problems.append(f"market.md's settings table lacks {variable}")
            continue
        default, also = rows[variable]
        said = default.split(" (")[0].strip("`")
        want = "" if field.default == "" else str(field.default)
        if said.strip('"') != want:
            problems.append(f"{variable}: doc default {said}, model {want}")
        choices = getattr(field.validation_alias, "choices", [variable])
        older = {c for c in choices if c != variable}
        if set(re.findall(r"`(\w+)`", also)) != older:
            problems.append(f"{variable}: doc's older names {also!r}, model {sorted(older)}")
    problems += [
        f"market.md documents {v}, which Settings lacks" for v in sorted(set(rows) - expected)
    ]
    return problems


# --- `make check` (tests/conftest.py's guard) -------------------------------------------------


def check_make_check(text: str) -> list[str]:
    """README says how the fast set starts no component, and each named piece exists."""
    from tests import processes

    flat = _flat(text)
    problems = []
    conftest = (ROOT / "tests" / "conftest.py").read_text()
    makefile = (ROOT / "Makefile").read_text()
    if (
        "`pytest --slow-reasons --collect-only -q`" not in flat
        or '"--slow-reasons"' not in conftest
    ):
        problems.append("README's `pytest --slow-reasons` and tests/conftest.py's option differ")
    if "(`tests.processes.forbid_components`)" not in flat or not hasattr(
        processes, "forbid_components"
    ):
        problems.append("README's guard `tests.processes.forbid_components` is gone from one side")
    if '(`-m "not slow"`)' not in flat or '-m "not slow"' not in makefile:
        problems.append("README's `-m \"not slow\"` and the Makefile's fast target differ")
    if "processes.forbid_components()" not in conftest:
        problems.append("tests/conftest.py no longer arms the guard in the fast run")
    words = {"two": 2, "three": 3, "four": 4}
    said = re.search(r"`make test` runs (\w+) test files at a time", flat)
    workers = re.search(r"^PYTEST_WORKERS \?= (\d+)$", makefile, re.M)
    if said is None or workers is None or words.get(said.group(1)) != int(workers.group(1)):
        problems.append("README's test files at a time and the Makefile's PYTEST_WORKERS differ")
    if "--dist loadfile" not in makefile:
        problems.append("the Makefile no longer runs whole test files per worker (--dist loadfile)")
    return problems


# --- CLI flags (the tpumarket parsers) --------------------------------------------------------


@functools.cache
def tpumarket_parser() -> argparse.ArgumentParser:
    """The `tpumarket` parser as `contracts.cli.main` builds it, from the entry points."""
    parser = argparse.ArgumentParser(prog="tpumarket")
    parser.add_argument("--version", action="version", version="tpumarket")
    commands = parser.add_subparsers(dest="command", required=True)
    for entry in sorted(entry_points(group="tpumarket.commands"), key=lambda e: e.name):
        entry.load()(commands)
    return parser


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _flags(parser: argparse.ArgumentParser) -> set[str]:
    return {o for action in parser._actions for o in action.option_strings}


def _all_flags(parser: argparse.ArgumentParser) -> set[str]:
    out = _flags(parser)
    for child in _subcommands(parser).values():
        out |= _all_flags(child)
    return out


FLAG = re.compile(r"(?<![\w-])(--[a-z][a-z0-9-]*)")
NOT_OURS = frozenset({"--net", "--pid", "--xla", "--prune-history", "--replicas", "--gil"})
"""Backticked flags of other programs a doc quotes (unshare, XLA_FLAGS, the node's pruning, the
profiler) or of what it says is not there."""
PYTEST_OWN = frozenset({"--collect-only", "--durations", "--co"})


def _command_lines(text: str) -> Iterator[str]:
    """Backticked spans and shell-block lines (continuations joined) that run `tpumarket`."""
    yield from re.findall(r"`([^`\n]*tpumarket [^`\n]*)`", text)
    for block in re.findall(r"^```(?:sh|bash|console)\n(.*?)^```$", text, re.S | re.M):
        command = None  # a synopsis goes on over indented lines
        for line in [*block.replace("\\\n", " ").splitlines(), ""]:
            code = line.split(" #")[0]
            if command is not None and line.startswith(" "):
                command += " " + code.strip()
                continue
            if command is not None:
                yield command
            command = code if "tpumarket " in code else None


def check_cli_flags(text: str) -> list[str]:
    """Every `tpumarket A B --flag` a doc shows is a flag of that subcommand, and every other
    backticked `--flag` one of some tpumarket command or of the script the span runs."""
    root = tpumarket_parser()
    problems = []
    for line in _command_lines(text):
        words = re.search(r"tpumarket((?: [a-z][a-z-]*)+)(.*)", line)
        if words is None:
            continue
        parser, path = root, list[str]()
        for word in words.group(1).split():
            children = _subcommands(parser)
            if word not in children:
                break
            parser, path = children[word], [*path, word]
        if not path:
            continue
        if _subcommands(parser) and len(words.group(1).split()) > len(path):
            problems.append(f"`tpumarket {' '.join(path)}` has no subcommand in {line!r}")
        for flag in sorted(set(FLAG.findall(line)) - _flags(parser)):
            problems.append(f"`tpumarket {' '.join(path)}` has no {flag} ({line.strip()!r})")
    every = _all_flags(root)
    for span in re.findall(r"`([^`\n]*)`", text):
        if "tpumarket " in span:
            continue
        script = re.match(r"(?:\w+=\S+ )*scripts/([\w-]+)", span)
        if re.match(r"(?:\.venv/bin/)?pytest ", span):
            source = (ROOT / "tests" / "conftest.py").read_text() + str(sorted(PYTEST_OWN))
            source = source.replace("'", '"')
        elif script is not None:
            name = script.group(1)
            paths = [ROOT / "scripts" / name, ROOT / "scripts" / (name.replace("-", "_") + ".py")]
            source = "".join(p.read_text() for p in paths if p.is_file())
        else:
            source = _script_sources()  # a bare flag in a benchmark's prose
        for flag in FLAG.findall(span):
            negated = "--" + flag.removeprefix("--no-")  # argparse's BooleanOptionalAction
            if flag in NOT_OURS or flag in every:
                continue
            if f'"{flag}"' not in source and f'"{negated}"' not in source:
                problems.append(f"{flag} (in `{span}`) is no flag of tpumarket or its script")
    return problems


def check_cli_defaults(text: str) -> list[str]:
    """In a shell block's synopsis, `[--flag N]` with a number N states the flag's default: it
    is the parser's (a placeholder, `[--flag T]`, states none)."""
    root = tpumarket_parser()
    problems = []
    for block in re.findall(r"^```(?:sh|bash|console)\n(.*?)^```$", text, re.S | re.M):
        parser = None
        for line in block.splitlines():
            words = re.search(r"tpumarket((?: [a-z][a-z-]*)+)", line)
            if words is not None:
                parser = root
                for word in words.group(1).split():
                    parser = _subcommands(parser).get(word, parser)
            if parser is None:
                continue
            for flag, value in re.findall(r"\[(--[a-z][a-z0-9-]*) ([0-9][0-9.]*)\]", line):
                actions = [a for a in parser._actions if flag in a.option_strings]
                if not actions or float(actions[0].default) != float(value):
                    default = actions[0].default if actions else "no such flag"
                    problems.append(f"[{flag} {value}] in a synopsis: the default is {default}")
    return problems


@functools.cache
def _script_sources() -> str:
    """Every script's source: a bare `--flag` in a benchmark's prose is one of theirs."""
    return "".join(p.read_text() for p in sorted((ROOT / "scripts").glob("*.py")))


# --- what the docs name: files, tests, Python names, the escrow's ABI ----------------------

FILE_SUFFIXES = (".sqlite3", ".json", ".py", ".toml", ".md", ".sol")
ESCROW_ABI = json.loads((ROOT / "contracts" / "artifacts" / "ComputeEscrow.json").read_text())[
    "abi"
]
ABI_NAMES = frozenset(item["name"] for item in ESCROW_ABI if "name" in item)


@functools.cache
def _test_names() -> frozenset[str]:
    source = "".join(p.read_text() for p in sorted((ROOT / "tests").rglob("*.py")))
    return frozenset(re.findall(r"def (test_\w+)", source))


def _resolves(dotted: str) -> bool:
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj: Any = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        try:
            for attribute in parts[i:]:
                obj = getattr(obj, attribute)
        except AttributeError:
            return False
        return True
    return False


def check_references(text: str) -> list[str]:
    """Every file a doc names in backticks exists, every test it names is defined, every dotted
    Python name resolves, and every escrow error and `call(` it names is in the escrow's ABI."""
    problems = []
    paths = r"`((?:contracts|market|provider|client|scripts|tests|docs)/[\w./*-]+)"
    for name in sorted(set(re.findall(paths, text))):
        path = name.split("::")[0].rstrip(".")
        if not any(ROOT.glob(path)):
            problems.append(f"no file {path}")
    for name in sorted(set(re.findall(r"\b(test_\w+)\b(?![*.])", text)) - _test_names()):
        problems.append(f"no test {name}")
    dotted = r"`((?:contracts|market|provider|client|tests)\.[A-Za-z_][\w.]*\w)`"
    for name in sorted(set(re.findall(dotted, text))):
        if not name.endswith(FILE_SUFFIXES) and not _resolves(name):
            problems.append(f"no Python name {name}")
    for name in sorted(set(re.findall(r"`(Escrow[A-Z]\w+)", text)) - ABI_NAMES):
        problems.append(f"the escrow has no error {name}")
    calls = set(re.findall(r"`([a-z]+[A-Z]\w*)\(", text)) - {"settleBy"}
    for name in sorted(calls - ABI_NAMES):
        problems.append(f"the escrow has no function {name}")
    return problems


# --- README's failure table and plan formula -------------------------------------------------


def check_failure_table(text: str) -> list[str]:
    """README's failure table: one row per category with its code and every hint, in order."""
    from provider.diagnosis import HINTS, Category

    rows = {}
    for line in text.splitlines():
        row = re.match(r"\| (\d+) \| `(\w+)` \| (.*) \|$", line)
        if row:
            rows[row.group(2)] = (int(row.group(1)), row.group(3))
    problems = []
    for category in Category:
        if category not in HINTS:
            continue  # success
        want = (category.code, " ".join(HINTS[category]))
        if rows.pop(category.value, None) != want:
            problems.append(f"failure table row {category.value}: want {want}")
    return problems + [f"failure table names {name}, no category" for name in sorted(rows)]


def check_plan_formula(text: str) -> list[str]:
    """README's plan formula names only Plan fields (typed_data.json), and its presets exist."""
    import contracts.pricing

    plan = {f["name"] for f in TYPED_DATA["types"]["Plan"]}
    section = text[text.index("### Plans") : text.index("## Task programs")]
    block = re.search(r"```\n(.*?)```", section, re.S)
    assert block is not None, "README's plan formula block is gone"
    named = set(re.findall(r"\b([a-z][a-z0-9]*[A-Z]\w*)\b", block.group(1))) - set(
        FIELDS["Receipt"]
    )
    # `tierDiscountBps` stands for either tier's field.
    unknown = {n for n in named - plan if not {n.replace("tier", f"tier{k}") for k in "12"} <= plan}
    problems = [f"the plan formula names {n}, no Plan or Receipt field" for n in sorted(unknown)]
    presets = re.search(r"presets of\s+that struct \((.*?)\)\.", section, re.S)
    assert presets is not None, "README no longer lists the plan presets"
    for name in re.findall(r"`(?:contracts\.pricing\.)?(\w+)`", presets.group(1)):
        if not callable(getattr(contracts.pricing, name, None)):
            problems.append(f"no preset contracts.pricing.{name}")
    return problems


def check_verify_constants(text: str) -> list[str]:
    """docs/market.md's account of where signatures are checked: the orders a request may hold
    to be verified on the event loop, and the orders recovered in one library call."""
    from market.service import INLINE_VERIFY_ORDERS
    from market.verify import RECOVER_CHUNK

    words = " ".join(text.split())
    want = (
        f"on the event loop for up to {INLINE_VERIFY_ORDERS} orders",
        f"the signatures of up to {RECOVER_CHUNK} orders recovered in one library call",
        f"let go once per {RECOVER_CHUNK} orders",
    )
    return [f"no longer says {w!r}" for w in want if w not in words]


def check_nonce_marks(text: str) -> list[str]:
    """docs/market.md's account of nonce marks: how many signers' marks the writer keeps."""
    from market.nonces import MAX_MARKED_SIGNERS

    want = f"for each of the last {MAX_MARKED_SIGNERS:,} signers seen"
    return [] if want in " ".join(text.split()) else [f"no longer says {want!r}"]


def check_wal_backstops(text: str) -> list[str]:
    """docs/market.md's account of checkpoints: the automatic checkpoint's threshold on the
    writer's connection and on the others (what a new connection of the market's engine says)."""
    import tempfile

    from market.database import make_engine
    from market.writer import WRITER_AUTOCHECKPOINT_PAGES

    with tempfile.TemporaryDirectory() as tmp:
        engine = make_engine(url=f"sqlite:///{tmp}/probe.sqlite3")
        try:
            with engine.connect() as connection:
                others = connection.exec_driver_sql("PRAGMA wal_autocheckpoint").scalar()
        finally:
            engine.dispose()
    want = (
        f"its automatic checkpoint is a backstop at {WRITER_AUTOCHECKPOINT_PAGES:,} pages, "
        f"other connections' at {others:,}"
    )
    return [] if want in " ".join(text.split()) else [f"no longer says {want!r}"]


# --- the tests -------------------------------------------------------------------------------

Check = Callable[[str], list[str]]
CHECKS: list[tuple[str, Check, list[Path]]] = [
    ("message fields", check_message_fields, ALL_DOCS),
    ("domain versions", check_domain_versions, ALL_DOCS),
    ("close and settle instants", check_instants, ALL_DOCS),
    ("contract constants", check_constants, ALL_DOCS),
    ("README's gas figure", check_readme_gas, [README]),
    ("settlement.md's gas table", check_settlement_gas, [ROOT / "docs" / "settlement.md"]),
    ("benchmarks.md's gas table", check_benchmarks_gas, [ROOT / "docs" / "benchmarks.md"]),
    ("provider config keys", check_provider_config, [ROOT / "docs" / "provider-api.md"]),
    ("market settings", check_market_settings, [ROOT / "docs" / "market.md"]),
    ("where signatures are checked", check_verify_constants, [ROOT / "docs" / "market.md"]),
    ("signers' nonce marks", check_nonce_marks, [ROOT / "docs" / "market.md"]),
    ("checkpoint backstops", check_wal_backstops, [ROOT / "docs" / "market.md"]),
    ("provider.toml keys", check_provider_toml, [README, ROOT / "docs" / "provider-api.md"]),
    ("make check's guard", check_make_check, [README]),
    ("CLI flags", check_cli_flags, ALL_DOCS),
    ("CLI defaults in synopses", check_cli_defaults, ALL_DOCS),
    ("files, tests, names", check_references, ALL_DOCS),
    ("README's failure table", check_failure_table, [README]),
    ("README's plan formula", check_plan_formula, [README]),
]


@pytest.mark.parametrize(("what", "check", "docs"), CHECKS, ids=[c[0] for c in CHECKS])
def test_docs_state_what_the_code_defines(what: str, check: Check, docs: list[Path]) -> None:
    problems = [f"{doc.relative_to(ROOT)}: {p}" for doc in docs for p in check(_doc(doc))]
    assert not problems, f"{what}:\n" + "\n".join(problems)


DRIFTS: list[tuple[str, Check, Path, str, str]] = [
    (
        "domain version",
        check_domain_versions,
        README,
        "(`ComputeEscrow`, `2`,",
        "(`ComputeEscrow`, `1`,",
    ),
    (
        "an Ack with a deadline",
        check_message_fields,
        README,
        "`requestHash`, `price`:",
        "`requestHash`, `deadline`, `price`:",
    ),
    (
        "a request without its deadline",
        check_message_fields,
        README,
        "maxPrice, deadline)`",
        "maxPrice)`",
    ),
    (
        "a heartbeat's fields",
        check_message_fields,
        ROOT / "docs" / "provider-api.md",
        "`Heartbeat(provider, advertHash, timestamp)`",
        "`Heartbeat(provider, timestamp)`",
    ),
    (
        "a market table row",
        check_message_fields,
        ROOT / "docs" / "market.md",
        "| provider, advertHash",
        "| provider, advert",
    ),
    (
        "close after one window",
        check_instants,
        README,
        "`expiry + 2 * challengeWindow`",
        "`expiry + challengeWindow`",
    ),
    (
        "settleBy from the ack's deadline",
        check_instants,
        ROOT / "docs" / "client.md",
        "settleBy = min(request.deadline, expiry)",
        "settleBy = min(ack.deadline, expiry)",
    ),
    (
        "a constant",
        check_constants,
        ROOT / "docs" / "settlement.md",
        "`CLOSE_AGREEMENT_WINDOWS` (2)",
        "`CLOSE_AGREEMENT_WINDOWS` (3)",
    ),
    (
        "a module constant",
        check_constants,
        ROOT / "docs" / "provider-api.md",
        "`provider.journal.SCHEMA_VERSION` = 4",
        "`provider.journal.SCHEMA_VERSION` = 3",
    ),
    ("README's gas", check_readme_gas, README, "about 965 gas", "about 950 gas"),
    (
        "settlement.md's gas",
        check_settlement_gas,
        ROOT / "docs" / "settlement.md",
        "| 965 (target",
        "| 991 (target",
    ),
    (
        "benchmarks.md's gas",
        check_benchmarks_gas,
        ROOT / "docs" / "benchmarks.md",
        "| **965** |",
        "| **991** |",
    ),
    (
        "a provider key left out",
        check_provider_config,
        ROOT / "docs" / "provider-api.md",
        "| `log_scheduler` | `false` | log the settlement scheduler's every run |\n",
        "",
    ),
    (
        "a provider default of none",
        check_provider_config,
        ROOT / "docs" / "provider-api.md",
        "| `market_url` | none |",
        '| `market_url` | `"http://x"` |',
    ),
    (
        "a provider default",
        check_provider_config,
        ROOT / "docs" / "provider-api.md",
        "| `claim_batch_max` | `200` |",
        "| `claim_batch_max` | `100` |",
    ),
    (
        "a market default",
        check_market_settings,
        ROOT / "docs" / "market.md",
        "| `TPUMARKET_MARKET_MAX_BATCH` | `500` |",
        "| `TPUMARKET_MARKET_MAX_BATCH` | `50` |",
    ),
    (
        "make check's guard",
        check_make_check,
        README,
        "(`tests.processes.forbid_components`)",
        "(a guard)",
    ),
    (
        "a CLI flag",
        check_cli_flags,
        README,
        "client offers --device-class cpu",
        "client offers --device cpu",
    ),
    (
        "a renamed test",
        check_references,
        SETTLEMENT,
        "`test_attack_client_opening_for_one_unit_locks_one_unit_of_stake`",
        "`test_attack_client_opening_for_one_unit_locks_the_stake`",
    ),
    (
        "a moved file",
        check_references,
        PROVIDER_API,
        "(`provider/heartbeat.py`",
        "(`provider/heartbeats.py`",
    ),
    (
        "a renamed Python name",
        check_references,
        PROVIDER_API,
        "`client.provider_http.ProviderHttp`",
        "`client.provider_http.ProviderClient`",
    ),
    (
        "a renamed escrow error",
        check_references,
        SETTLEMENT,
        "`EscrowTaskIndexTooLarge`",
        "`EscrowTaskIndexTooHigh`",
    ),
    ("a renamed escrow call", check_references, README, "`openDeal(", "`openDeals("),
    (
        "a failure hint dropped",
        check_failure_table,
        README,
        " Rematerialize activations (jax.checkpoint) to cut temporaries.",
        "",
    ),
    (
        "a failure code moved",
        check_failure_table,
        README,
        "| 11 | `execute_error`",
        "| 12 | `execute_error`",
    ),
    (
        "a plan field renamed",
        check_plan_formula,
        README,
        "tier2 if index >= tier2FromTask",
        "tier2 if index >= tier2StartTask",
    ),
    ("a preset renamed", check_plan_formula, README, "`with_cache_discount`", "`cache_discount`"),
    (
        "test files at a time",
        check_make_check,
        README,
        "runs three test files",
        "runs four test files",
    ),
    (
        "a synopsis default",
        check_cli_defaults,
        ROOT / "docs" / "client.md",
        "[--grace-s 5]",
        "[--grace-s 10]",
    ),
    (
        "a synopsis flag on a continued line",
        check_cli_flags,
        ROOT / "docs" / "client.md",
        "[--wait-refunds]",
        "[--wait-refund]",
    ),
    ("a README toml key", check_provider_toml, README, "slo_ms = 60000", "slo = 60000"),
    (
        "the orders recovered in one call",
        check_verify_constants,
        ROOT / "docs" / "market.md",
        "go once per 16 orders",
        "go once per 32 orders",
    ),
    (
        "the signers' marks kept",
        check_nonce_marks,
        ROOT / "docs" / "market.md",
        "the last 16,384 signers",
        "the last 65,536 signers",
    ),
    (
        "the writer's checkpoint backstop",
        check_wal_backstops,
        ROOT / "docs" / "market.md",
        "a backstop at 100,000 pages",
        "a backstop at 10,000 pages",
    ),
    (
        "a docs toml key",
        check_provider_toml,
        PROVIDER_API,
        "claim_batch_max = 200",
        "claim_max = 200",
    ),
]


@pytest.mark.parametrize(("what", "check", "doc", "old", "new"), DRIFTS, ids=[d[0] for d in DRIFTS])
def test_each_check_refuses_a_drifted_copy(
    what: str, check: Check, doc: Path, old: str, new: str
) -> None:
    text = _doc(doc)
    assert old in text, f"{doc.relative_to(ROOT)} no longer holds {old!r}: update this drift"
    assert check(text.replace(old, new, 1)), f"{what}: the check let a drifted copy pass"


def test_the_client_cli_prints_the_escrows_unilateral_close_instant() -> None:
    from client.deal_cli import UNILATERAL_CLOSE_WINDOWS, closes_alone_at

    assert unilateral_close_windows() == UNILATERAL_CLOSE_WINDOWS
    assert closes_alone_at(1_000, 60) == 1_000 + unilateral_close_windows() * 60
    assert CONSTANTS["CLOSE_AGREEMENT_WINDOWS"] == 2  # docs say "two windows" in prose too
