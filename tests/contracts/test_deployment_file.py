"""Deployment files: `tpumarket chain deploy` on a real anvil writes what `chain verify` then
checks against the chain and the shipped code; a wrong chain, a foreign escrow, an edited file
and a fee-on-transfer token are each refused with a one-line reason."""

from __future__ import annotations

import dataclasses
import json
from decimal import Decimal
from pathlib import Path

import pytest
from eth_utils.address import to_checksum_address

from contracts.cli import main
from contracts.deployment import (
    EXISTING_TOKEN,
    DeploymentError,
    DeploymentRecord,
    deploy,
    parse_deployment,
    read_deployment,
    verify_deployment,
    write_deployment,
)
from contracts.keystore import write_keystore
from tests.contracts.conftest import World
from tests.contracts.delegation import compile_test_contracts
from tests.deployment_sample import SAMPLE

FEE_TOKEN = Path(__file__).resolve().parent / "sol" / "FeeToken.sol"


def _cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(argv)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_deploy_from_a_keystore_then_verify(
    world: World, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    keystore, passphrase = tmp_path / "deployer.json", tmp_path / "pass"
    passphrase.write_text("correct horse\n")
    key = world.anvil.new_funded_key()
    write_keystore(keystore, key, "correct horse", scrypt_n=2**4)
    out = tmp_path / "deployment.json"
    chain_id = world.anvil.chain_id
    argv = ["chain", "deploy", "--rpc-url", world.anvil.url, "--keystore", str(keystore)]
    argv += ["--passphrase-file", str(passphrase), "--chain-id", str(chain_id)]
    code, printed, err = _cli([*argv, "--out", str(out)], capsys)
    assert code == 0, err
    assert "raw private key" not in err
    record = read_deployment(out)
    assert record.chain_id == chain_id and record.escrow in printed
    escrow = to_checksum_address(record.escrow)
    w3 = world.chain.w3
    created = [
        w3.eth.get_transaction_receipt(tx)["contractAddress"]  # type: ignore[arg-type]
        for tx in w3.eth.get_block(record.deployment_block)["transactions"]
    ]
    assert escrow in created  # the escrow was created in the block the file names
    assert world.chain.escrow(record.escrow).token() == record.token
    code, printed, err = _cli(
        ["chain", "verify", "--rpc-url", world.anvil.url, "--deployment", str(out)], capsys
    )
    assert code == 0 and printed.startswith("ok:"), err
    # a second deploy never overwrites the file
    code, _, err = _cli([*argv, "--out", str(out)], capsys)
    assert code == 2 and "exists" in err


def test_wrong_chain_id_is_refused_before_any_transaction(world: World) -> None:
    key = world.anvil.new_funded_key()
    nonce = world.chain.w3.eth.get_transaction_count(to_checksum_address(_address(key)))
    with pytest.raises(DeploymentError, match="chain id"):
        deploy(world.chain, key, expect_chain_id=world.anvil.chain_id + 1)
    assert world.chain.w3.eth.get_transaction_count(to_checksum_address(_address(key))) == nonce


def test_verify_names_each_difference(world: World, tmp_path: Path) -> None:
    record = deploy(world.chain, world.anvil.new_funded_key(), min_challenge_window=7)
    verify_deployment(world.chain, record)
    with pytest.raises(DeploymentError, match="chain id"):
        verify_deployment(world.chain, dataclasses.replace(record, chain_id=record.chain_id + 1))
    # another escrow (same code, other periods) is not this deployment
    with pytest.raises(DeploymentError, match="shipped escrow"):
        verify_deployment(world.chain, dataclasses.replace(record, escrow=world.escrow.address))
    # a token contract where the escrow should be
    with pytest.raises(DeploymentError, match="shipped escrow"):
        verify_deployment(world.chain, dataclasses.replace(record, escrow=record.token))
    with pytest.raises(DeploymentError, match="shipped token"):
        verify_deployment(world.chain, dataclasses.replace(record, deployer=record.escrow))
    path = tmp_path / "d.json"
    write_deployment(path, record)
    write_deployment(path, record)  # the same record again is a no-op
    with pytest.raises(DeploymentError, match="another deployment"):
        write_deployment(path, dataclasses.replace(record, deployment_block=0))


def test_existing_plain_token_is_taken_and_fee_token_refused(world: World) -> None:
    key = world.anvil.new_funded_key()
    world.token.mint(world.deployer, _address(key), 10)
    record = deploy(world.chain, key, token=world.token.address)
    assert record.token == world.token.address and record.token_code == EXISTING_TOKEN
    verify_deployment(world.chain, record)

    code = compile_test_contracts(FEE_TOKEN, ("FeeToken",))["FeeToken"]
    fee_token = to_checksum_address(world.chain.tx.send(key, None, code)["contractAddress"])
    before = world.chain.w3.eth.get_transaction_count(to_checksum_address(_address(key)))
    with pytest.raises(DeploymentError, match="not a plain ERC-20"):
        deploy(world.chain, key, token=fee_token)
    # the probe transfer was the only transaction: no escrow was deployed over that token
    assert (
        world.chain.w3.eth.get_transaction_count(to_checksum_address(_address(key))) == before + 1
    )
    with pytest.raises(DeploymentError, match="no contract"):
        deploy(world.chain, key, token=_address(world.anvil.new_funded_key()))


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda d: d.update(format=2), "format"),
        (lambda d: d.update(escrow=d["escrow"].lower()), "escrow must be a checksummed"),
        (lambda d: d.update(chain_id=-1), "chain_id"),
        (lambda d: d.update(extra=1), "unknown field"),
        (lambda d: d.update(escrow_code="existing"), "escrow_code"),
    ],
)
def test_edited_file_is_refused(edit: object, message: str) -> None:
    data = dict(SAMPLE)
    parse_deployment(json.dumps(data))
    edit(data)  # type: ignore[operator]
    with pytest.raises(DeploymentError, match=message):
        parse_deployment(json.dumps(data))


def _address(key: str) -> str:
    from contracts.messages import address_of

    return address_of(key)


OPERATIONS = Path(__file__).resolve().parents[2] / "docs" / "operations.md"


def _table(text: str, header: str) -> list[list[str]]:
    lines = text[text.index(header) :].splitlines()[2:]
    rows = []
    for line in lines:
        if not line.startswith("|"):
            break
        rows.append([cell.strip().strip("`") for cell in line.strip("|").split("|")])
    return rows


def test_operations_doc_lists_every_deployment_field_and_the_snapshot_gas() -> None:
    text = OPERATIONS.read_text()
    fields = [row[0] for row in _table(text, "| field | what |")]
    assert sorted(fields) == sorted(f.name for f in dataclasses.fields(DeploymentRecord))
    snapshot = json.loads((OPERATIONS.parents[1] / "contracts" / "gas-snapshot.json").read_text())
    rows = _table(text, "| step | gas | ETH at 0.01 gwei |")
    assert rows, "no gas table"
    for step, gas, eth in rows:
        assert int(gas) == snapshot[step], (
            f"{step}: the doc says {gas}, the snapshot {snapshot[step]}"
        )
        assert Decimal(eth) == Decimal(snapshot[step]) * Decimal("0.01") / Decimal(10**9), step
