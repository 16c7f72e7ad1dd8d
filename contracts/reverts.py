"""Typed Python exceptions, one per custom error of the contracts, with the same names.

A test checks that this set equals the compiled ABI's errors.
"""

from __future__ import annotations

from contracts.errors import ContractRevert


class EscrowAckMismatch(ContractRevert):
    """Thrown when an ack answers another request than the one presented."""


class EscrowArbitrationOver(ContractRevert):
    """Thrown when the arbiter rules after the arbitration period."""


class EscrowChallengeWindowTooShort(ContractRevert):
    """Thrown when a quote's challenge window is below the escrow's minimum."""


class EscrowPriceAboveRequest(ContractRevert):
    """Thrown when a claimed amount is above the request's signed maxPrice."""


class EscrowAmountMismatch(ContractRevert):
    """Thrown when a receipt's amount differs from the plan's price for its usage."""


class EscrowArbitrationOpen(ContractRevert):
    """Thrown when a dispute is lapsed before the arbitration period ends."""


class EscrowBadBatch(ContractRevert):
    """Thrown when a claim batch is empty."""


class EscrowBatchNotFound(ContractRevert):
    """Thrown when a batch id is unknown."""


class EscrowBatchWrongStatus(ContractRevert):
    """Thrown when a batch is not in the state the action needs."""


class EscrowCapExceeded(ContractRevert):
    """Thrown when a payment would take a deal past its spending cap."""


class EscrowChallengeWindowClosed(ContractRevert):
    """Thrown when a batch is disputed after its challenge window."""


class EscrowChallengeWindowOpen(ContractRevert):
    """Thrown when a batch is finalized before its challenge window ends."""


class EscrowClaimPeriodOver(ContractRevert):
    """Thrown when a task is claimed after its settlement instant."""


class EscrowClaimsPending(ContractRevert):
    """Thrown when a deal closes while claims await their window or a ruling."""


class EscrowDeadlineNotPassed(ContractRevert):
    """Thrown when a breach refund is asked before the task's settlement instant."""


class EscrowDealNotFound(ContractRevert):
    """Thrown when a deal id is unknown."""


class EscrowDealNotOpen(ContractRevert):
    """Thrown when a deal is closed."""


class EscrowInsufficientBalance(ContractRevert):
    """Thrown when a free balance cannot cover a withdrawal or a deal's cap."""


class EscrowInsufficientStake(ContractRevert):
    """Thrown when a provider's free stake cannot cover an unstake or a deal's stake."""


class EscrowInvalidPlan(ContractRevert):
    """Thrown when a plan has a discount above 100% or unordered tiers."""


class EscrowInvalidSignature(ContractRevert):
    """Thrown when a signature is malformed, malleable, or not by the expected signer."""


class EscrowInvalidTerms(ContractRevert):
    """Thrown when quote terms are unusable (no arbiter, zero duration, fee above cap)."""


class EscrowNonceUsed(ContractRevert):
    """Thrown when a quote nonce was used or cancelled before."""


class EscrowPlanMismatch(ContractRevert):
    """Thrown when claimed receipts come with a plan other than the deal's."""


class EscrowQuoteExpired(ContractRevert):
    """Thrown when a quote is used after its validity."""


class EscrowReceiptForOtherDeal(ContractRevert):
    """Thrown when a receipt, ack or request belongs to another deal."""


class EscrowReceiptLate(ContractRevert):
    """Thrown when a receipt finished after its request's deadline."""


class EscrowSpendAboveQuote(ContractRevert):
    """Thrown when a deal's cap exceeds what the quote accepts."""


class EscrowStaleVoucher(ContractRevert):
    """Thrown when a voucher does not raise the amount of the last redeemed one."""


class EscrowTaskAlreadySettled(ContractRevert):
    """Thrown when a task was already vouched, claimed or refunded."""


class EscrowTaskIndexTooLarge(ContractRevert):
    """Thrown when a task index or voucher bitmap is beyond the supported range."""


class EscrowUnauthorized(ContractRevert):
    """Thrown when the caller has no right to this action."""


class EscrowWrongClient(ContractRevert):
    """Thrown when a quote names another client."""


class EscrowZeroAmount(ContractRevert):
    """Thrown when an amount that must be positive is zero."""


class InvalidShortString(ContractRevert):
    """Raised for the contract error InvalidShortString."""


class ReentrancyGuardReentrantCall(ContractRevert):
    """Raised for the contract error ReentrancyGuardReentrantCall."""


class SafeERC20FailedOperation(ContractRevert):
    """Raised for the contract error SafeERC20FailedOperation."""


class StringTooLong(ContractRevert):
    """Raised for the contract error StringTooLong."""


class ERC20InsufficientAllowance(ContractRevert):
    """Raised for the contract error ERC20InsufficientAllowance."""


class ERC20InsufficientBalance(ContractRevert):
    """Raised for the contract error ERC20InsufficientBalance."""


class ERC20InvalidApprover(ContractRevert):
    """Raised for the contract error ERC20InvalidApprover."""


class ERC20InvalidReceiver(ContractRevert):
    """Raised for the contract error ERC20InvalidReceiver."""


class ERC20InvalidSender(ContractRevert):
    """Raised for the contract error ERC20InvalidSender."""


class ERC20InvalidSpender(ContractRevert):
    """Raised for the contract error ERC20InvalidSpender."""


class SettlementTokenUnauthorized(ContractRevert):
    """Thrown when someone other than the deployer mints."""


REVERTS: dict[str, type[ContractRevert]] = {
    "EscrowAckMismatch": EscrowAckMismatch,
    "EscrowArbitrationOver": EscrowArbitrationOver,
    "EscrowChallengeWindowTooShort": EscrowChallengeWindowTooShort,
    "EscrowPriceAboveRequest": EscrowPriceAboveRequest,
    "EscrowAmountMismatch": EscrowAmountMismatch,
    "EscrowArbitrationOpen": EscrowArbitrationOpen,
    "EscrowBadBatch": EscrowBadBatch,
    "EscrowBatchNotFound": EscrowBatchNotFound,
    "EscrowBatchWrongStatus": EscrowBatchWrongStatus,
    "EscrowCapExceeded": EscrowCapExceeded,
    "EscrowChallengeWindowClosed": EscrowChallengeWindowClosed,
    "EscrowChallengeWindowOpen": EscrowChallengeWindowOpen,
    "EscrowClaimPeriodOver": EscrowClaimPeriodOver,
    "EscrowClaimsPending": EscrowClaimsPending,
    "EscrowDeadlineNotPassed": EscrowDeadlineNotPassed,
    "EscrowDealNotFound": EscrowDealNotFound,
    "EscrowDealNotOpen": EscrowDealNotOpen,
    "EscrowInsufficientBalance": EscrowInsufficientBalance,
    "EscrowInsufficientStake": EscrowInsufficientStake,
    "EscrowInvalidPlan": EscrowInvalidPlan,
    "EscrowInvalidSignature": EscrowInvalidSignature,
    "EscrowInvalidTerms": EscrowInvalidTerms,
    "EscrowNonceUsed": EscrowNonceUsed,
    "EscrowPlanMismatch": EscrowPlanMismatch,
    "EscrowQuoteExpired": EscrowQuoteExpired,
    "EscrowReceiptForOtherDeal": EscrowReceiptForOtherDeal,
    "EscrowReceiptLate": EscrowReceiptLate,
    "EscrowSpendAboveQuote": EscrowSpendAboveQuote,
    "EscrowStaleVoucher": EscrowStaleVoucher,
    "EscrowTaskAlreadySettled": EscrowTaskAlreadySettled,
    "EscrowTaskIndexTooLarge": EscrowTaskIndexTooLarge,
    "EscrowUnauthorized": EscrowUnauthorized,
    "EscrowWrongClient": EscrowWrongClient,
    "EscrowZeroAmount": EscrowZeroAmount,
    "InvalidShortString": InvalidShortString,
    "ReentrancyGuardReentrantCall": ReentrancyGuardReentrantCall,
    "SafeERC20FailedOperation": SafeERC20FailedOperation,
    "StringTooLong": StringTooLong,
    "ERC20InsufficientAllowance": ERC20InsufficientAllowance,
    "ERC20InsufficientBalance": ERC20InsufficientBalance,
    "ERC20InvalidApprover": ERC20InvalidApprover,
    "ERC20InvalidReceiver": ERC20InvalidReceiver,
    "ERC20InvalidSender": ERC20InvalidSender,
    "ERC20InvalidSpender": ERC20InvalidSpender,
    "SettlementTokenUnauthorized": SettlementTokenUnauthorized,
}
