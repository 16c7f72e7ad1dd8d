"""``tpumarket chain deploy`` and ``tpumarket chain verify``: put the escrow on any EVM chain
and write its deployment file, or check a deployment already there."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from contracts.cli import InputError, check_address, check_private_key


def register_deploy(actions: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add ``chain deploy`` and ``chain verify`` to the ``chain`` command's actions."""
    from contracts.binding import DEFAULT_ARBITRATION_PERIOD, DEFAULT_MIN_CHALLENGE_WINDOW

    deploy = actions.add_parser(
        "deploy",
        help="deploy the escrow (and a token, unless --token) and write a deployment file",
    )
    deploy.add_argument("--rpc-url", required=True, help="the chain's JSON-RPC URL")
    deploy.add_argument(
        "--chain-id", type=int, default=None, help="refuse to deploy unless the node serves this id"
    )
    signer = deploy.add_mutually_exclusive_group(required=True)
    signer.add_argument("--keystore", type=Path, help="the deployer's keystore file")
    signer.add_argument(
        "--private-key", help="the deployer's raw key (development on a local chain only)"
    )
    deploy.add_argument("--passphrase-file", type=Path, default=None)
    deploy.add_argument(
        "--token",
        default=None,
        help="an existing ERC-20 to settle in (checked to move exact amounts); "
        "default: deploy the project's settlement token",
    )
    deploy.add_argument(
        "--min-challenge-window", type=int, default=DEFAULT_MIN_CHALLENGE_WINDOW, metavar="S"
    )
    deploy.add_argument(
        "--arbitration-period", type=int, default=DEFAULT_ARBITRATION_PERIOD, metavar="S"
    )
    deploy.add_argument(
        "--out", type=Path, required=True, help="where to write the deployment file"
    )
    deploy.set_defaults(handler=_deploy)

    verify = actions.add_parser(
        "verify", help="check a deployment file against the chain and the shipped contract code"
    )
    verify.add_argument("--rpc-url", required=True, help="the chain's JSON-RPC URL")
    verify.add_argument("--deployment", type=Path, required=True, help="the deployment file")
    verify.set_defaults(handler=_verify)


def _deployer_key(args: argparse.Namespace) -> str:
    from contracts.keystore import RAW_KEY_WARNING, load_key, read_passphrase

    if args.keystore is not None:
        return load_key(args.keystore, read_passphrase(args.passphrase_file))
    print(RAW_KEY_WARNING, file=sys.stderr)
    return check_private_key(args.private_key, what="--private-key")


def _deploy(args: argparse.Namespace) -> int:
    from contracts.binding import Chain
    from contracts.deployment import deploy, write_deployment

    if args.out.exists():
        raise InputError(f"{args.out} exists; choose a new path for the deployment file")
    token = check_address(args.token, what="--token") if args.token else None
    key = _deployer_key(args)
    chain = Chain(args.rpc_url)
    record = deploy(
        chain,
        key,
        token=token,
        expect_chain_id=args.chain_id,
        min_challenge_window=args.min_challenge_window,
        arbitration_period=args.arbitration_period,
    )
    write_deployment(args.out, record)
    print(f"chain id  {record.chain_id}")
    print(f"token     {record.token}")
    print(f"escrow    {record.escrow} (block {record.deployment_block})")
    print(
        f"written   {args.out}: give it as `deployment` to the market, daemon, client and arbiter"
    )
    return 0


def _verify(args: argparse.Namespace) -> int:
    from contracts.binding import Chain
    from contracts.deployment import read_deployment, verify_deployment

    record = read_deployment(args.deployment)
    verify_deployment(Chain(args.rpc_url), record)
    print(
        f"ok: chain id {record.chain_id}, escrow {record.escrow} and token {record.token} "
        "hold the code this version ships"
    )
    return 0
