"""The settlement layer's exception root and its families."""

from __future__ import annotations


class EscrowError(Exception):
    """Root of every error raised by the `contracts` package."""


class CompilationError(EscrowError):
    """The Solidity compiler failed or is not installed."""


class ChainError(EscrowError):
    """The chain could not be started, reached or used."""


class ChainTimeoutError(ChainError):
    """The chain did not answer, or did not mine a sent transaction, in time."""


class FeeTooLowError(ChainError):
    """The chain refused a transaction whose fee is below what it currently accepts."""


class NonceTooLowError(ChainError):
    """The chain refused a transaction whose nonce its sender has already used."""


class TransactionRevertedError(ChainError):
    """A mined transaction reverted (estimation passed, execution did not)."""


class CallRevertedError(ChainError):
    """A call or gas estimate reverted with no custom error the contracts declare (a bare
    revert, a reason string, a panic); nothing was sent."""


class StaleBlockError(ChainError):
    """The node kept answering for a block it does not have (pruned, or past a lagging head),
    though asked again."""


class SignatureError(EscrowError, ValueError):
    """A signature is malformed or was not made by the expected signer."""


class ContractRevert(EscrowError):
    """A contract call reverted with a custom error of the escrow; subclasses bear its name."""

    def __init__(self, name: str, args: dict[str, object]) -> None:
        self.error_name = name
        self.error_args = args
        detail = ", ".join(f"{k}={v!r}" for k, v in args.items())
        super().__init__(f"{name}({detail})")
