"""Deployment files: where the token and the escrow live on one chain, checked against the
shipped contract code.

``tpumarket chain deploy`` deploys (or takes an existing ERC-20, after checking that a transfer
moves exactly what it says) and writes one JSON file: the chain id, both addresses, the
escrow's deployment block, its two periods and the hashes of the shipped runtime code. The
market, the provider daemon, the client and the arbiter read that file (their ``deployment``
setting) instead of separate addresses and blocks, and ``tpumarket chain verify`` checks a
deployment already on a chain against the shipped artifacts, byte for byte outside the
constructor-set values.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from eth_account import Account
from eth_utils.address import is_checksum_address, to_checksum_address
from eth_utils.crypto import keccak

from contracts.binding import DEFAULT_ARBITRATION_PERIOD, DEFAULT_MIN_CHALLENGE_WINDOW, Chain
from contracts.cli import InputError
from contracts.compiler import Artifact
from contracts.eip712 import Domain

FORMAT = 1
"""The deployment file's format version; a reader refuses any other."""

ESCROW = "ComputeEscrow"
TOKEN = "SettlementToken"
EXISTING_TOKEN = "existing"
"""The ``token_code`` of a deployment over an ERC-20 the project did not deploy."""


class DeploymentError(InputError):
    """A deployment file that cannot be read, or a chain that does not hold what it says."""


@dataclass(frozen=True)
class DeploymentRecord:
    """One deployment of the escrow (and its token) on one chain."""

    chain_id: int
    token: str
    escrow: str
    deployment_block: int
    min_challenge_window: int
    arbitration_period: int
    deployer: str
    escrow_code: str
    """keccak of the shipped escrow runtime code (constructor-set words zeroed)."""
    token_code: str = EXISTING_TOKEN
    """keccak of the shipped token runtime code, or ``existing`` for an outside ERC-20."""
    format: int = field(default=FORMAT)

    def to_json(self) -> str:
        """Return the file's text (sorted keys, one trailing newline)."""
        return json.dumps(asdict(self), indent=2, sort_keys=True) + "\n"


_INT_FIELDS = ("chain_id", "deployment_block", "min_challenge_window", "arbitration_period")
_ADDRESS_FIELDS = ("token", "escrow", "deployer")


def parse_deployment(text: str, *, source: str = "deployment") -> DeploymentRecord:
    """Parse and check a deployment file's text; raise :class:`DeploymentError` naming the
    first field that is wrong."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise DeploymentError(f"{source}: not JSON ({exc.msg} at line {exc.lineno})") from None
    if not isinstance(data, dict):
        raise DeploymentError(f"{source}: not a JSON object")
    if data.get("format") != FORMAT:
        raise DeploymentError(
            f"{source}: format {data.get('format')!r}, this version reads {FORMAT}"
        )
    known = {f for f in DeploymentRecord.__dataclass_fields__}
    unknown = sorted(set(data) - known)
    if unknown:
        raise DeploymentError(f"{source}: unknown field {unknown[0]!r}")
    for name in _INT_FIELDS:
        value = data.get(name)
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise DeploymentError(f"{source}: {name} must be a non-negative integer")
    for name in _ADDRESS_FIELDS:
        value = data.get(name)
        if not isinstance(value, str) or not is_checksum_address(value):
            raise DeploymentError(f"{source}: {name} must be a checksummed address")
    for name in ("escrow_code", "token_code"):
        value = data.get(name)
        if not isinstance(value, str) or not (value == EXISTING_TOKEN or _is_hash(value)):
            raise DeploymentError(f"{source}: {name} must be a 0x-prefixed 32-byte hash")
    if data["escrow_code"] == EXISTING_TOKEN:
        raise DeploymentError(f"{source}: escrow_code must be a 0x-prefixed 32-byte hash")
    return DeploymentRecord(**data)


def _is_hash(value: str) -> bool:
    return (
        len(value) == 66
        and value.startswith("0x")
        and all(c in "0123456789abcdef" for c in value[2:])
    )


def read_deployment(path: Path) -> DeploymentRecord:
    """Read the deployment file at ``path``."""
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise DeploymentError(f"deployment file {path}: {exc.strerror}") from None
    return parse_deployment(text, source=f"deployment file {path}")


def write_deployment(path: Path, record: DeploymentRecord) -> None:
    """Write ``record`` to ``path`` atomically; refuse to replace a different deployment."""
    path = Path(path)
    if path.exists():
        try:
            same = read_deployment(path) == record
        except DeploymentError:
            same = False
        if not same:
            raise DeploymentError(f"{path} exists and holds another deployment; choose a new path")
        return
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_text(record.to_json())
    os.replace(temporary, path)


def code_hash(runtime: bytes) -> str:
    """Return the keccak of runtime code, as a 0x-prefixed hex string."""
    return "0x" + keccak(runtime).hex()


def _runtime(artifact: Artifact) -> bytes:
    return bytes.fromhex(artifact.deployed_bytecode.removeprefix("0x"))


def shipped_code_hash(artifact: Artifact) -> str:
    """Return the hash of an artifact's runtime code as shipped (immutables still zero)."""
    return code_hash(_runtime(artifact))


def _word(value: int | str) -> bytes:
    if isinstance(value, str):
        value = int(value, 16)
    return value.to_bytes(32, "big")


def matches_shipped(code: bytes, shipped: bytes, immutables: list[int | str]) -> bool:
    """Return whether runtime ``code`` read from a chain is the ``shipped`` runtime code with
    constructor-set words filled in: same length, and every byte that differs lies in a 32-byte
    word that is zero in the shipped code and holds one of ``immutables`` on chain."""
    if len(code) != len(shipped):
        return False
    words = {_word(value) for value in immutables}
    zero = bytes(32)
    for index in range(len(code)):
        if code[index] == shipped[index]:
            continue
        starts = range(max(0, index - 31), min(index, len(code) - 32) + 1)
        if not any(shipped[s : s + 32] == zero and code[s : s + 32] in words for s in starts):
            return False
    return True


def escrow_immutables(
    chain_id: int, escrow: str, token: str, min_challenge_window: int, arbitration_period: int
) -> list[int | str]:
    """Return the words the escrow's constructor sets: its token and periods, and the EIP-712
    domain it caches (chain id, its own address, the separator, the hashed and short-string
    name and version)."""
    domain = Domain(chain_id=chain_id, verifying_contract=escrow)
    words: list[int | str] = [token, min_challenge_window, arbitration_period, chain_id, escrow]
    words.append("0x" + domain.separator().hex())
    for text in (domain.name, domain.version):
        encoded = text.encode()
        words.append("0x" + keccak(encoded).hex())
        if len(encoded) < 32:  # a short string: the bytes, then the length in the last byte
            words.append("0x" + (encoded.ljust(31, b"\0") + bytes([len(encoded)])).hex())
    return words


def deploy(
    chain: Chain,
    key: str,
    *,
    token: str | None = None,
    expect_chain_id: int | None = None,
    min_challenge_window: int = DEFAULT_MIN_CHALLENGE_WINDOW,
    arbitration_period: int = DEFAULT_ARBITRATION_PERIOD,
) -> DeploymentRecord:
    """Deploy the escrow (and the settlement token unless ``token`` names an existing ERC-20)
    with ``key``; return the record to write. An existing token must move exactly the amount a
    transfer names (a fee-on-transfer token would leave the escrow short of what it owes)."""
    chain_id = int(chain.w3.eth.chain_id)
    if expect_chain_id is not None and chain_id != expect_chain_id:
        raise DeploymentError(f"the node serves chain id {chain_id}, not {expect_chain_id}")
    if min_challenge_window < 1 or arbitration_period < 1:
        raise DeploymentError("the challenge window and the arbitration period are at least 1 s")
    token_code = EXISTING_TOKEN
    if token is None:
        shipped = chain.artifacts[TOKEN]
        receipt = chain.tx.send(key, None, shipped.bytecode)
        token = to_checksum_address(receipt["contractAddress"])
        token_code = shipped_code_hash(shipped)
    else:
        token = to_checksum_address(token)
        check_plain_token(chain, key, token)
    shipped = chain.artifacts[ESCROW]
    ctor = chain.w3.eth.contract(abi=shipped.abi, bytecode=shipped.bytecode)
    data = ctor.constructor(token, min_challenge_window, arbitration_period).data_in_transaction
    receipt = chain.tx.send(key, None, data)
    record = DeploymentRecord(
        chain_id=chain_id,
        token=token,
        escrow=to_checksum_address(receipt["contractAddress"]),
        deployment_block=int(receipt["blockNumber"]),
        deployer=Account.from_key(key).address,
        min_challenge_window=min_challenge_window,
        arbitration_period=arbitration_period,
        escrow_code=shipped_code_hash(shipped),
        token_code=token_code,
    )
    verify_deployment(chain, record)
    return record


def check_plain_token(chain: Chain, key: str, token: str) -> None:
    """Refuse a token address without code, or one whose transfer does not move exactly the
    amount named: one base unit is sent from ``key`` to a fresh address and both balances read."""
    if not chain.w3.eth.get_code(to_checksum_address(token)):
        raise DeploymentError(f"no contract at token address {token}")
    bound = chain.token(token)
    sender = Account.from_key(key).address
    probe = Account.create().address
    before_sender = bound.balance_of(sender)
    if before_sender < 1:
        raise DeploymentError(
            f"cannot check that {token} moves exact amounts: the deployer {sender} holds none of "
            "it (one base unit is sent to a fresh address to check)"
        )
    bound.transfer(key, probe, 1)
    moved_out = before_sender - bound.balance_of(sender)
    moved_in = bound.balance_of(probe)
    if moved_out != 1 or moved_in != 1:
        raise DeploymentError(
            f"{token} is not a plain ERC-20: a transfer of 1 took {moved_out} from the sender and "
            f"gave {moved_in} to the recipient (fee-on-transfer or rebasing tokens are refused)"
        )


def verify_deployment(chain: Chain, record: DeploymentRecord) -> None:
    """Check that the chain holds ``record``'s deployment: the chain id, the escrow's runtime
    code against the shipped artifact (its constructor-set words zeroed), its token and
    periods, and the token's code when the project deployed it. Raise
    :class:`DeploymentError` listing every difference."""
    problems: list[str] = []
    chain_id = int(chain.w3.eth.chain_id)
    if chain_id != record.chain_id:
        raise DeploymentError(
            f"the node serves chain id {chain_id}, the deployment is for chain id {record.chain_id}"
        )
    escrow_code = bytes(chain.w3.eth.get_code(to_checksum_address(record.escrow)))
    if not escrow_code:
        raise DeploymentError(f"no contract at the escrow address {record.escrow}")
    immutables = escrow_immutables(
        chain_id,
        record.escrow,
        record.token,
        record.min_challenge_window,
        record.arbitration_period,
    )
    shipped = chain.artifacts[ESCROW]
    if not matches_shipped(escrow_code, _runtime(shipped), immutables):
        raise DeploymentError(
            f"the code at {record.escrow} is not the shipped escrow's built with this file's "
            "token and periods"
        )
    escrow = chain.escrow(record.escrow)
    if record.escrow_code != shipped_code_hash(shipped):
        problems.append("the deployment names escrow code other than this version ships")
    if escrow.token() != record.token:
        problems.append(f"the escrow's token is {escrow.token()}, not {record.token}")
    if escrow.min_challenge_window() != record.min_challenge_window:
        problems.append("the escrow's minimum challenge window differs from the file's")
    if escrow.arbitration_period() != record.arbitration_period:
        problems.append("the escrow's arbitration period differs from the file's")
    if record.token_code != EXISTING_TOKEN:
        token_code = bytes(chain.w3.eth.get_code(to_checksum_address(record.token)))
        # The shipped token's one constructor-set word is its minter, the deployer.
        shipped = chain.artifacts[TOKEN]
        if record.token_code != shipped_code_hash(shipped) or not matches_shipped(
            token_code, _runtime(shipped), [record.deployer]
        ):
            problems.append("the token's code is not the shipped token's (minted by the deployer)")
    if problems:
        raise DeploymentError("; ".join(problems))


def with_deployment(values: dict[str, Any], *, block_key: str | None = None) -> dict[str, Any]:
    """Return a component's raw settings with what their ``deployment`` file names: the
    escrow (one also given must be the file's), the chain id and, under ``block_key``, the
    deployment block unless set. Raise ValueError (a settings error) for a bad file."""
    if not values.get("deployment"):
        return values
    try:
        record = read_deployment(Path(str(values["deployment"])))
    except DeploymentError as exc:
        raise ValueError(str(exc)) from None
    given = values.get("escrow")
    if given and str(given).lower() != record.escrow.lower():
        raise ValueError(f"escrow {given} is not the deployment file's {record.escrow}")
    filled = {**values, "escrow": record.escrow, "chain_id": record.chain_id}
    if block_key is not None:
        filled[block_key] = values.get(block_key) or record.deployment_block
    return filled
