"""A test-only ERC-1271 wallet contract, compiled with the project's solc and deployed on anvil."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import solcx
from eth_abi.abi import encode as abi_encode
from eth_utils.address import to_checksum_address
from web3.contract import Contract

from contracts import compiler
from contracts.binding import Escrow, Token, TxResult
from contracts.messages import address_of
from tests.workers import write_atomically

SOURCE = Path(__file__).resolve().parent / "sol" / "TestWallet.sol"


def compile_wallet() -> tuple[list[dict[str, Any]], str]:
    """Return the wallet's ABI and creation bytecode (cached by a hash of the compiler input)."""
    source = {
        "language": "Solidity",
        "sources": {"TestWallet.sol": {"content": SOURCE.read_text()}},
        "settings": {
            "evmVersion": compiler.EVM_VERSION,
            "optimizer": {"enabled": True, "runs": 200},
            "outputSelection": {"*": {"*": ["abi", "evm.bytecode.object"]}},
        },
    }
    encoded = json.dumps(source, sort_keys=True).encode()
    key = hashlib.sha256(encoded + compiler.SOLC_VERSION.encode()).hexdigest()
    cached = compiler.cache_dir() / f"test-wallet-{key}.json"
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
    contract = output["contracts"]["TestWallet.sol"]["TestWallet"]
    return contract["abi"], "0x" + contract["evm"]["bytecode"]["object"]


@dataclass
class Wallet:
    """A deployed TestWallet driven by its owner's key, acting on one escrow and token."""

    address: str
    owner: str  # the owner's private key: it signs digests for the wallet and sends its calls
    escrow: Escrow
    token: Token
    abi: list[dict[str, Any]]

    @classmethod
    def deploy(cls, owner: str, escrow: Escrow, token: Token) -> Wallet:
        """Deploy a wallet owned by the key `owner`."""
        abi, bytecode = compile_wallet()
        args = abi_encode(["address"], [address_of(owner)]).hex()
        receipt = escrow.tx.send(owner, None, bytecode + args)
        return cls(to_checksum_address(receipt["contractAddress"]), owner, escrow, token, abi)

    def call(self, target: Escrow | Token, function: str, *args: Any) -> TxResult:
        """Call `function` of `target` as the wallet; its revert comes back typed."""
        inner = target.contract.encode_abi(function, args=list(args))
        wallet = self._contract()
        data = wallet.encode_abi("execute", args=[target.address, inner])
        receipt = self.escrow.tx.send(self.owner, self.address, data)
        return TxResult(
            tx_hash=receipt["transactionHash"].to_0x_hex(),
            gas_used=receipt["gasUsed"],
            block_number=receipt["blockNumber"],
            events=target.decode_events(receipt["logs"]),
        )

    def _contract(self) -> Contract:
        return self.escrow.tx.w3.eth.contract(
            address=to_checksum_address(self.address), abi=self.abi
        )

    def set_accepting(self, accepting: bool) -> None:
        """Make the wallet accept or refuse every signature from now on."""
        wallet = self._contract()
        self.escrow.tx.send(
            self.owner, self.address, wallet.encode_abi("setAccepting", [accepting])
        )
