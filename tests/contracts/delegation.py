"""EIP-7702 delegations on anvil: test delegates compiled with the project's solc, real type-4
transactions carrying authorizations that eth-account signs."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import solcx
from eth_account import Account
from eth_utils.address import to_checksum_address

from contracts import compiler
from contracts.messages import address_of
from tests.workers import write_atomically

from .conftest import World

SOURCE = Path(__file__).resolve().parent / "sol" / "Delegates.sol"
DELEGATES = ("RefusingDelegate", "GasBurningDelegate", "HonestDelegate")
DESIGNATOR = bytes.fromhex("ef0100")  # a delegated account's code: 0xef0100 || delegate address
SET_CODE_GAS = 100_000


def compile_delegates() -> dict[str, str]:
    """Return each delegate's creation bytecode by name (cached by a hash of the input)."""
    return compile_test_contracts(SOURCE, DELEGATES)


def compile_test_contracts(path: Path, names: tuple[str, ...]) -> dict[str, str]:
    """Return the creation bytecode of each of `names` in the test source at `path` (compiled
    with the project's solc, cached by a hash of the input)."""
    source = {
        "language": "Solidity",
        "sources": {path.name: {"content": path.read_text()}},
        "settings": {
            "evmVersion": compiler.EVM_VERSION,
            "optimizer": {"enabled": True, "runs": 200},
            "outputSelection": {"*": {"*": ["evm.bytecode.object"]}},
        },
    }
    encoded = json.dumps(source, sort_keys=True).encode()
    key = hashlib.sha256(encoded + compiler.SOLC_VERSION.encode()).hexdigest()
    cached = compiler.cache_dir() / f"test-{path.stem}-{key}.json"
    if cached.exists():
        output = json.loads(cached.read_text())
    else:
        output = solcx.compile_standard(
            source,
            solc_binary=str(compiler.SOLC_BINARY),
            base_path=str(compiler.REPO_ROOT),
            allow_paths=[str(compiler.REPO_ROOT)],
        )
        write_atomically(cached, json.dumps(output))  # parallel workers read this cache
    built = output["contracts"][path.name]
    return {name: "0x" + built[name]["evm"]["bytecode"]["object"] for name in names}


def deploy_delegates(world: World) -> dict[str, str]:
    """Deploy the three delegates; return their addresses by name."""
    deployer = world.anvil.new_funded_key()
    return {
        name: to_checksum_address(world.escrow.tx.send(deployer, None, code)["contractAddress"])
        for name, code in compile_delegates().items()
    }


def delegate(world: World, key: str, target: str) -> None:
    """Delegate the account of `key` to the code at `target` with a type-4 transaction that a
    fresh account sponsors (anyone may send a signed authorization)."""
    w3 = world.escrow.tx.w3
    authority = to_checksum_address(address_of(key))
    authorization = Account.sign_authorization(
        {
            "chainId": world.escrow.tx.chain_id,
            "address": to_checksum_address(target),
            "nonce": w3.eth.get_transaction_count(authority),
        },
        key,
    )
    sponsor = world.anvil.new_funded_key()
    max_fee, tip = world.escrow.tx.fees(refresh=True)
    tx: dict[str, Any] = {
        "type": 4,
        "chainId": world.escrow.tx.chain_id,
        "nonce": w3.eth.get_transaction_count(to_checksum_address(address_of(sponsor))),
        "to": to_checksum_address(address_of(sponsor)),
        "value": 0,
        "data": b"",
        "gas": SET_CODE_GAS,
        "maxFeePerGas": max_fee,
        "maxPriorityFeePerGas": tip,
        "authorizationList": [authorization],
    }
    signed = Account.sign_transaction(tx, sponsor)
    receipt = w3.eth.wait_for_transaction_receipt(
        w3.eth.send_raw_transaction(signed.raw_transaction)
    )
    assert receipt["status"] == 1
    # The authorization raised the authority's nonce: the transactor reads it afresh.
    world.escrow.tx.reset_nonces()
    code = bytes(w3.eth.get_code(authority))
    assert code == DESIGNATOR + bytes.fromhex(target.removeprefix("0x")), code.hex()
