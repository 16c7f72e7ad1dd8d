"""Compile the Solidity sources offline with the repo's solc-js wrapper, cached by input hash."""

from __future__ import annotations

import hashlib
import json
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import solcx

from contracts.errors import CompilationError

PACKAGE_DIR = Path(__file__).resolve().parent
REPO_ROOT = PACKAGE_DIR.parent
SOURCE_DIR = PACKAGE_DIR / "sol"
SOLC_BINARY = PACKAGE_DIR / "bin" / "solc"
NODE_MODULES = REPO_ROOT / "node_modules"
EVM_VERSION = "cancun"
OPTIMIZER_RUNS = 20_000
CONTRACT_NAMES = ("ComputeEscrow", "SettlementToken")
SOLC_VERSION = "0.8.37"
# Build artifacts shipped in the package, so a pip-installed daemon or client binds a deployed
# escrow without Node: written by `python -m contracts.compiler`, checked against the sources.
ARTIFACT_DIR = PACKAGE_DIR / "artifacts"


@dataclass(frozen=True)
class Artifact:
    """ABI and bytecode of one compiled contract."""

    name: str
    abi: list[dict[str, Any]]
    bytecode: str
    deployed_bytecode: str


def cache_dir() -> Path:
    """Return the directory that holds compiled outputs keyed by input hash."""
    return Path(os.environ.get("TPUMARKET_CACHE", REPO_ROOT / ".cache")) / "solc"


def standard_input() -> dict[str, Any]:
    """Build the standard-JSON compiler input from every source under `contracts/sol`."""
    sources = {
        f"contracts/sol/{path.relative_to(SOURCE_DIR).as_posix()}": {"content": path.read_text()}
        for path in sorted(SOURCE_DIR.rglob("*.sol"))
    }
    return {
        "language": "Solidity",
        "sources": sources,
        "settings": {
            "evmVersion": EVM_VERSION,
            "optimizer": {"enabled": True, "runs": OPTIMIZER_RUNS},
            "viaIR": True,
            "remappings": ["@openzeppelin/=node_modules/@openzeppelin/"],
            "outputSelection": {
                "*": {"*": ["abi", "evm.bytecode.object", "evm.deployedBytecode.object"]}
            },
        },
    }


def source_hash() -> str:
    """Return the hash of the compiler input and version: what an artifact was built from."""
    encoded = json.dumps(standard_input(), sort_keys=True).encode()
    return hashlib.sha256(encoded + SOLC_VERSION.encode()).hexdigest()


def load_contracts() -> dict[str, Artifact]:
    """Return the artifacts: the shipped ones when they match the sources, else compile."""
    shipped = shipped_artifacts()
    if shipped is not None and shipped[1] == source_hash():
        return shipped[0]
    return compile_contracts()


def shipped_artifacts() -> tuple[dict[str, Artifact], str] | None:
    """Return the shipped artifacts and the source hash they were built from, if present."""
    found: dict[str, Artifact] = {}
    hashes = set()
    for name in CONTRACT_NAMES:
        path = ARTIFACT_DIR / f"{name}.json"
        if not path.exists():
            return None
        data = json.loads(path.read_text())
        hashes.add(data["sourceHash"])
        found[name] = Artifact(
            name=name,
            abi=data["abi"],
            bytecode=data["bytecode"],
            deployed_bytecode=data["deployedBytecode"],
        )
    return (found, hashes.pop()) if len(hashes) == 1 else None


def write_artifacts() -> None:
    """Compile the sources and write the shipped artifacts."""
    artifacts = compile_contracts()
    built_from = source_hash()
    ARTIFACT_DIR.mkdir(exist_ok=True)
    for name, artifact in artifacts.items():
        data = {
            "contractName": name,
            "compiler": f"solc {SOLC_VERSION} via-IR runs={OPTIMIZER_RUNS} evm={EVM_VERSION}",
            "sourceHash": built_from,
            "abi": artifact.abi,
            "bytecode": artifact.bytecode,
            "deployedBytecode": artifact.deployed_bytecode,
        }
        (ARTIFACT_DIR / f"{name}.json").write_text(json.dumps(data, indent=1) + "\n")


def compile_contracts(*, use_cache: bool = True) -> dict[str, Artifact]:
    """Compile the contracts (or load them from the cache) and return artifacts by name."""
    source = standard_input()
    key = source_hash()
    cached = cache_dir() / f"{key}.json"
    if use_cache and cached.exists():
        output = json.loads(cached.read_text())
    else:
        output = _run_solc(source)
        cached.parent.mkdir(parents=True, exist_ok=True)
        # A name of its own per process: two compiling at once never write one temporary file.
        tmp = cached.with_suffix(f".{os.getpid()}.{threading.get_ident()}.tmp")
        tmp.write_text(json.dumps(output))
        tmp.replace(cached)
    return _artifacts(output)


def _run_solc(source: dict[str, Any]) -> dict[str, Any]:
    if not NODE_MODULES.joinpath("solc").exists():
        raise CompilationError("solc-js is not installed: run `make setup` (npm ci) first")
    try:
        output: dict[str, Any] = solcx.compile_standard(
            source,
            solc_binary=str(SOLC_BINARY),
            base_path=str(REPO_ROOT),
            allow_paths=[str(REPO_ROOT)],
        )
    except solcx.exceptions.SolcError as exc:
        raise CompilationError(str(exc).split("> command:")[0].strip()) from exc
    return output


def _artifacts(output: dict[str, Any]) -> dict[str, Artifact]:
    found: dict[str, Artifact] = {}
    for contracts in output["contracts"].values():
        for name, data in contracts.items():
            if name in CONTRACT_NAMES:
                found[name] = Artifact(
                    name=name,
                    abi=data["abi"],
                    bytecode="0x" + data["evm"]["bytecode"]["object"],
                    deployed_bytecode="0x" + data["evm"]["deployedBytecode"]["object"],
                )
    missing = set(CONTRACT_NAMES) - found.keys()
    if missing:
        raise CompilationError(f"compiler output lacks {sorted(missing)}")
    return found


if __name__ == "__main__":
    write_artifacts()
