"""The settlement layer's exception root and its families."""

from __future__ import annotations


class EscrowError(Exception):
    """Root of every error raised by the `contracts` package."""


class CompilationError(EscrowError):
    """The Solidity compiler failed or is not installed."""


class ChainError(EscrowError):
    """The chain could not be started, reached or used."""


class SignatureError(EscrowError, ValueError):
    """A signature is malformed or was not made by the expected signer."""


class ContractRevert(EscrowError):
    """A contract call reverted with a custom error of the escrow; subclasses bear its name."""

    def __init__(self, name: str, args: dict[str, object]) -> None:
        self.error_name = name
        self.error_args = args
        detail = ", ".join(f"{k}={v!r}" for k, v in args.items())
        super().__init__(f"{name}({detail})")
