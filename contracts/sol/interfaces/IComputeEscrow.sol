// SPDX-License-Identifier: MIT
pragma solidity ^0.8.24;

import {Plan, Quote, TaskRequest, Ack, Receipt, Voucher, Claim} from "../types/Messages.sol";

/// @title IComputeEscrow
/// @notice Escrow for accelerator compute: clients lock a spending cap per deal, providers lock a
/// stake; tasks are paid by cumulative client vouchers the provider redeems, claimed with the
/// client's signed request and the provider's receipt when the client is silent, or refunded
/// with a penalty when the provider misses the request's deadline.
/// @dev Time rule: each task has one settlement instant, `settleBy = min(request deadline,
/// expiry) + challengeWindow`. The provider may claim it until then; the client may refund it
/// only after; a unilateral close waits until `expiry + 2 * challengeWindow`. An early close
/// needs both parties' agreements in force: each lapses two challenge windows after it is given.
interface IComputeEscrow {
    /// @notice Lifecycle of a deal.
    enum DealStatus {
        None,
        Open,
        Closed
    }

    /// @notice Lifecycle of a batch of claimed receipts.
    enum BatchStatus {
        None,
        Pending,
        Disputed,
        Paid,
        Rejected
    }

    /// @notice Settlement state of one task of a deal.
    enum TaskStatus {
        None,
        Vouched,
        Claimed,
        Refunded
    }

    /// @notice A deal as stored.
    struct DealView {
        address client;
        address provider;
        address arbiter;
        DealStatus status;
        uint64 expiry;
        uint64 challengeWindow;
        uint256 maxSpend;
        uint256 committed; // paid out of the deal: vouchers, settled claims, refunds, fee
        uint256 vouched; // cumulative amount of the last redeemed voucher
        uint256 pending; // claimed, awaiting the challenge window or a ruling
        uint256 stake; // provider stake still locked (at opening: lockedStake of the quote)
        uint256 penalty;
        bytes32 planHash;
        uint32 batchCount;
        bool clientAgreedClose; // the client's early-close agreement is in force now
        bool providerAgreedClose; // the provider's early-close agreement is in force now
    }

    /// @notice A batch of claimed receipts as stored.
    struct BatchView {
        uint256 amount;
        uint64 deadline; // end of the challenge window, or of arbitration once disputed
        BatchStatus status;
        uint32 tasks; // number of tasks claimed in the batch
    }

    /// @notice Emitted when an account deposits tokens into its free balance.
    event Deposited(address indexed account, uint256 amount);
    /// @notice Emitted when an account withdraws tokens from its free balance.
    event Withdrawn(address indexed account, uint256 amount);
    /// @notice Emitted when a provider adds to its free stake.
    event Staked(address indexed provider, uint256 amount);
    /// @notice Emitted when a provider takes back free stake.
    event Unstaked(address indexed provider, uint256 amount);
    /// @notice Emitted when a provider cancels a quote nonce.
    event QuoteNonceCancelled(address indexed provider, uint256 nonce);
    /// @notice Emitted when a deal opens from a signed quote, with every term an indexer needs;
    /// `stake` is the stake the deal locks: {lockedStake} of the quote's stake for `maxSpend`.
    event DealOpened(
        uint256 indexed dealId,
        address indexed client,
        address indexed provider,
        address arbiter,
        uint256 maxSpend,
        uint256 stake,
        uint256 penalty,
        uint64 expiry,
        uint64 challengeWindow,
        uint64 sloMs,
        bytes32 planHash,
        bytes32 quoteHash
    );
    /// @notice Emitted when a deal's reservation fee is credited to its provider.
    event ReservationFeePaid(uint256 indexed dealId, address indexed provider, uint256 fee);
    /// @notice Emitted when a voucher is redeemed; `paid` is the increase over the last one and
    /// `newTasks` the bitmap words (from word 0) of the tasks this redemption newly paid.
    event VoucherRedeemed(uint256 indexed dealId, uint256 cumulativeAmount, uint256 paid, uint256[] newTasks);
    /// @notice Emitted when a provider claims a batch of tasks; `taskIndexes` in claim order.
    event ReceiptsClaimed(
        uint256 indexed dealId, uint32 indexed batchId, uint256 amount, uint32[] taskIndexes, uint64 deadline
    );
    /// @notice Emitted when an undisputed batch pays out after its challenge window.
    event ClaimFinalized(uint256 indexed dealId, uint32 indexed batchId, uint256 amount);
    /// @notice Emitted when the client disputes a claimed batch.
    event ClaimDisputed(uint256 indexed dealId, uint32 indexed batchId, uint64 arbitrationDeadline);
    /// @notice Emitted when a dispute ends, by ruling or by lapse. When the client wins, the
    /// batch's amount is unlocked for it (`refund`) and it receives the penalty once per task.
    event DisputeResolved(
        uint256 indexed dealId, uint32 indexed batchId, bool providerWins, uint256 amount, uint256 refund, uint256 penalty
    );
    /// @notice Emitted when an arbiter sets the fee it charges per dispute it rules; deals opened
    /// from then on take it.
    event ArbiterFeeSet(address indexed arbiter, uint256 fee);
    /// @notice Emitted when a ruling pays the deal's arbiter its fee, from the side that lost
    /// (`payer`: the client, from the fee it held when disputing; the provider, from the deal's
    /// stake left after the penalty).
    event ArbiterFeePaid(
        uint256 indexed dealId, uint32 indexed batchId, address indexed arbiter, address payer, uint256 fee
    );
    /// @notice Emitted when a breached task is refunded with the penalty.
    event BreachRefunded(uint256 indexed dealId, uint32 indexed taskIndex, uint256 refund, uint256 penalty);
    /// @notice Emitted when one party agrees to close a deal early.
    event CloseAgreed(uint256 indexed dealId, address indexed party);
    /// @notice Emitted when a party withdraws its early-close agreement.
    event CloseAgreementWithdrawn(uint256 indexed dealId, address indexed party);
    /// @notice Emitted when a deal closes.
    event DealClosed(uint256 indexed dealId, uint256 returnedToClient, uint256 stakeReturned);

    /// @notice Thrown when an amount that must be positive is zero.
    error EscrowZeroAmount();
    /// @notice Thrown when a free balance cannot cover a withdrawal or a deal's cap.
    error EscrowInsufficientBalance(address account, uint256 available, uint256 needed);
    /// @notice Thrown when a provider's free stake cannot cover an unstake or a deal's stake.
    error EscrowInsufficientStake(address provider, uint256 available, uint256 needed);
    /// @notice Thrown when a quote is used after its validity.
    error EscrowQuoteExpired(uint64 validUntil);
    /// @notice Thrown when a quote nonce was used or cancelled before.
    error EscrowNonceUsed(address provider, uint256 nonce);
    /// @notice Thrown when a signature is malformed, malleable, or not by the expected signer.
    error EscrowInvalidSignature(address expectedSigner);
    /// @notice Thrown when a quote names another client.
    error EscrowWrongClient(address expected, address actual);
    /// @notice Thrown when a deal's cap exceeds what the quote accepts.
    error EscrowSpendAboveQuote(uint256 maxSpend, uint256 quoted);
    /// @notice Thrown when a plan has a discount above 100% or unordered tiers.
    error EscrowInvalidPlan();
    /// @notice Thrown when quote terms are unusable (no arbiter, an arbiter that is the provider
    /// or the client, zero duration, fee above cap, amounts past 128 bits, or times past 64 bits).
    error EscrowInvalidTerms();
    /// @notice Thrown when a quote's challenge window is below the escrow's minimum.
    error EscrowChallengeWindowTooShort(uint64 challengeWindow, uint64 minimum);
    /// @notice Thrown when a deal id is unknown.
    error EscrowDealNotFound(uint256 dealId);
    /// @notice Thrown when a deal is closed.
    error EscrowDealNotOpen(uint256 dealId);
    /// @notice Thrown when the caller has no right to this action.
    error EscrowUnauthorized(address account);
    /// @notice Thrown when a voucher does not raise the amount of the last redeemed one.
    error EscrowStaleVoucher(uint256 dealId, uint256 cumulativeAmount, uint256 redeemed);
    /// @notice Thrown when a payment would take a deal past its spending cap.
    error EscrowCapExceeded(uint256 dealId, uint256 cap, uint256 needed);
    /// @notice Thrown when a task was already vouched, claimed or refunded.
    error EscrowTaskAlreadySettled(uint256 dealId, uint32 taskIndex);
    /// @notice Thrown when a task index or voucher bitmap is beyond the supported range.
    error EscrowTaskIndexTooLarge(uint256 taskIndex);
    /// @notice Thrown when a breach refund is asked before the task's settlement instant.
    error EscrowDeadlineNotPassed(uint256 refundableAt);
    /// @notice Thrown when claimed receipts come with a plan other than the deal's.
    error EscrowPlanMismatch(uint256 dealId);
    /// @notice Thrown when a receipt, ack or request belongs to another deal.
    error EscrowReceiptForOtherDeal(uint256 dealId, uint256 receiptDealId);
    /// @notice Thrown when a receipt's amount differs from the plan's price for its usage.
    error EscrowAmountMismatch(uint32 taskIndex, uint256 claimed, uint256 priced);
    /// @notice Thrown when a claimed amount is above the request's signed maxPrice.
    error EscrowPriceAboveRequest(uint32 taskIndex, uint256 amount, uint256 maxPrice);
    /// @notice Thrown when a receipt finished after its request's deadline.
    error EscrowReceiptLate(uint32 taskIndex, uint64 finishedAt, uint64 deadline);
    /// @notice Thrown when an ack answers another request than the one presented.
    error EscrowAckMismatch(uint32 taskIndex);
    /// @notice Thrown when a claim batch is empty.
    error EscrowBadBatch();
    /// @notice Thrown when a task is claimed after its settlement instant.
    error EscrowClaimPeriodOver(uint32 taskIndex, uint256 settleBy);
    /// @notice Thrown when a batch id is unknown.
    error EscrowBatchNotFound(uint256 dealId, uint32 batchId);
    /// @notice Thrown when a batch is not in the state the action needs.
    error EscrowBatchWrongStatus(uint256 dealId, uint32 batchId, BatchStatus status);
    /// @notice Thrown when a batch is finalized before its challenge window ends.
    error EscrowChallengeWindowOpen(uint64 deadline);
    /// @notice Thrown when a batch is disputed after its challenge window.
    error EscrowChallengeWindowClosed(uint64 deadline);
    /// @notice Thrown when a dispute is lapsed before the arbitration period ends.
    error EscrowArbitrationOpen(uint64 deadline);
    /// @notice Thrown when the arbiter rules after the arbitration period.
    error EscrowArbitrationOver(uint64 deadline);
    /// @notice Thrown when a deal closes while claims await their window or a ruling.
    error EscrowClaimsPending(uint256 dealId, uint256 pending);

    /// @notice Move `amount` tokens from the caller into its free balance.
    function deposit(uint256 amount) external;

    /// @notice Move `amount` tokens from the caller's free balance back to the caller.
    function withdraw(uint256 amount) external;

    /// @notice Move `amount` tokens from the caller into its free provider stake.
    function stake(uint256 amount) external;

    /// @notice Move `amount` of free stake (not locked by open deals) back to the caller.
    function unstake(uint256 amount) external;

    /// @notice Make a quote nonce unusable, so a signed quote can no longer open a deal.
    function cancelQuoteNonce(uint256 nonce) external;

    /// @notice Open a deal with a provider-signed quote naming the caller, locking `maxSpend` of
    /// the caller's free balance and, from the provider's free stake, the share of the quote's
    /// stake that `maxSpend` is of the quote's maxSpend, rounded up ({lockedStake}).
    /// @return dealId The new deal's id.
    function openDeal(Quote calldata quote, bytes calldata signature, uint256 maxSpend)
        external
        returns (uint256 dealId);

    /// @notice Pay the provider the increase of a client-signed cumulative voucher. Callable by
    /// the deal's provider only (the payee decides which voucher to redeem).
    function redeemVoucher(Voucher calldata voucher, bytes calldata signature) external;

    /// @notice Claim tasks the client requested and did not vouch, each with its receipt and the
    /// client's signed request; the receipt's deadline must be the request's, its amount the
    /// plan's price for its usage and at most the request's maxPrice, and each task must be
    /// claimed by its settlement instant. They pay after the challenge window unless disputed.
    /// Callable by the deal's provider.
    /// @return batchId The claimed batch's id within the deal.
    function claimReceipts(uint256 dealId, Plan calldata plan, Claim[] calldata claims)
        external
        returns (uint32 batchId);

    /// @notice Pay an undisputed batch after its challenge window. Callable by anyone.
    function finalizeClaim(uint256 dealId, uint32 batchId) external;

    /// @notice Dispute a pending batch within its challenge window. Callable by the client. When
    /// the deal's arbiter charges a fee, the client's free balance holds one fee for the dispute
    /// until it ends: paid to the arbiter if the client loses the ruling, returned otherwise.
    function disputeClaim(uint256 dealId, uint32 batchId) external;

    /// @notice Rule on a disputed batch before the arbitration period ends. Callable by the
    /// deal's arbiter. A ruling for the client unlocks the batch for it and pays the penalty per
    /// task from the stake. The deal's arbiter fee is paid by the side that loses: by the client
    /// from the fee it held, or by the provider from the stake left after the penalty.
    function resolveDispute(uint256 dealId, uint32 batchId, bool providerWins) external;

    /// @notice End a dispute the arbiter left unresolved past the arbitration period, for the
    /// client. Callable by anyone. No fee is paid: the client's held fee returns to it.
    function lapseDispute(uint256 dealId, uint32 batchId) external;

    /// @notice Refund an acked task not settled by its settlement instant (request deadline,
    /// capped at expiry, plus the challenge window), and pay the client the deal's penalty from
    /// the stake. Callable by the deal's client, with the request and the provider-signed ack.
    function refundBreach(TaskRequest calldata request, Ack calldata ack, bytes calldata ackSignature) external;

    /// @notice Close a deal: alone after expiry plus twice the challenge window, or early when
    /// both parties' agreements are in force. Before that instant a call records the caller's
    /// agreement, which lapses two challenge windows later. Unspent funds return to the client,
    /// stake to the provider.
    function closeDeal(uint256 dealId) external;

    /// @notice Withdraw the caller's early-close agreement (client or provider of an open deal).
    function withdrawCloseAgreement(uint256 dealId) external;

    /// @notice The settlement token.
    function token() external view returns (address);

    /// @notice Free balance of `account`.
    function balanceOf(address account) external view returns (uint256);

    /// @notice Free stake of `provider` (not locked by deals).
    function stakeOf(address provider) external view returns (uint256);

    /// @notice Whether a provider's quote nonce is used or cancelled.
    function isNonceUsed(address provider, uint256 nonce) external view returns (bool);

    /// @notice A deal as stored.
    function getDeal(uint256 dealId) external view returns (DealView memory);

    /// @notice A claimed batch as stored.
    function getBatch(uint256 dealId, uint32 batchId) external view returns (BatchView memory);

    /// @notice The shortest challenge window a quote may set.
    function minChallengeWindow() external view returns (uint64);

    /// @notice Set the fee the caller, as an arbiter, charges per dispute it rules. A deal takes
    /// the fee in force when it opens and keeps it.
    function setArbiterFee(uint256 fee) external;

    /// @notice The fee `arbiter` charges per ruled dispute of deals opened now.
    function arbiterFee(address arbiter) external view returns (uint256);

    /// @notice A deal's arbiter fee per ruled dispute and the fees its client holds in
    /// disputes not yet ended.
    function dealArbiterFee(uint256 dealId) external view returns (uint256 fee, uint256 held);

    /// @notice How long an arbiter has to rule before a dispute lapses for the client.
    function arbitrationPeriod() external view returns (uint64);

    /// @notice Settlement state of one task (a task of a batch ruled for the client stays
    /// Claimed; its batch says how it ended).
    function taskStatus(uint256 dealId, uint32 taskIndex) external view returns (TaskStatus);

    /// @notice Number of deals opened so far.
    function dealCount() external view returns (uint256);

    /// @notice The stake a deal opened for `maxSpend` locks under a quote of `quoteStake` for
    /// `quoteMaxSpend`: ceil(quoteStake * maxSpend / quoteMaxSpend).
    function lockedStake(uint256 quoteStake, uint256 quoteMaxSpend, uint256 maxSpend)
        external
        pure
        returns (uint256);

    /// @notice The plan's price for one task's usage.
    function price(Plan calldata plan, uint8 kind, uint8 status, bool cacheHit, uint64 deviceMs, uint32 taskIndex)
        external
        pure
        returns (uint256);

    /// @notice EIP-712 digest of a quote under this escrow's domain.
    function quoteDigest(Quote calldata quote) external view returns (bytes32);

    /// @notice EIP-712 digest of a task request under this escrow's domain.
    function taskRequestDigest(TaskRequest calldata request) external view returns (bytes32);

    /// @notice EIP-712 digest of an ack under this escrow's domain.
    function ackDigest(Ack calldata ack) external view returns (bytes32);

    /// @notice EIP-712 digest of a receipt under this escrow's domain.
    function receiptDigest(Receipt calldata receipt) external view returns (bytes32);

    /// @notice EIP-712 digest of a voucher under this escrow's domain.
    function voucherDigest(Voucher calldata voucher) external view returns (bytes32);

    /// @notice EIP-712 struct hash of a plan, as deals store it.
    function planHash(Plan calldata plan) external pure returns (bytes32);
}
