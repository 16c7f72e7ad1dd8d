// SPDX-License-Identifier: MIT
pragma solidity ^0.8.24;

import {IERC20} from "@openzeppelin/contracts/token/ERC20/IERC20.sol";
import {SafeERC20} from "@openzeppelin/contracts/token/ERC20/utils/SafeERC20.sol";
import {ReentrancyGuardTransient} from "@openzeppelin/contracts/utils/ReentrancyGuardTransient.sol";
import {EIP712} from "@openzeppelin/contracts/utils/cryptography/EIP712.sol";

import {IComputeEscrow} from "./interfaces/IComputeEscrow.sol";
import {MessageHashing} from "./libraries/MessageHashing.sol";
import {PlanPricing} from "./libraries/PlanPricing.sol";
import {SignerCheck} from "./libraries/SignerCheck.sol";
import {Plan, Quote, TaskRequest, Ack, Receipt, Voucher, Claim} from "./types/Messages.sol";

/// @title ComputeEscrow
/// @notice See {IComputeEscrow}. Money invariant: the token balance of this contract equals the
/// sum of free balances, free stakes, and every open deal's locked funds (cap minus committed)
/// and locked stake. A signature is valid when it ECDSA-recovers to its signer, whatever code the
/// signer has now, and otherwise only by the signer's ERC-1271 answer ({SignerCheck}).
contract ComputeEscrow is IComputeEscrow, EIP712, ReentrancyGuardTransient {
    using SafeERC20 for IERC20;
    using MessageHashing for Plan;
    using MessageHashing for Quote;
    using MessageHashing for TaskRequest;
    using MessageHashing for Ack;
    using MessageHashing for Receipt;
    using MessageHashing for Voucher;

    /// @notice Tasks per deal: task indices are below this, voucher bitmaps have at most 256 words.
    uint256 public constant MAX_TASKS = 65_536;
    /// @notice Arbitration period of deployments that do not choose one.
    uint64 public constant DEFAULT_ARBITRATION_PERIOD = 7 days;
    /// @notice A party's early-close agreement lapses this many challenge windows after it was
    /// given: one for the provider to claim what no voucher pays, one for those claims to finalize.
    uint256 public constant CLOSE_AGREEMENT_WINDOWS = 2;

    struct Deal {
        address client;
        uint64 expiry;
        DealStatus status;
        address provider;
        uint64 challengeWindow;
        uint32 batchCount;
        address arbiter;
        uint48 clientAgreedCloseAt; // when the client last agreed to close early (0: never)
        uint48 providerAgreedCloseAt; // when the provider last agreed to close early (0: never)
        uint128 maxSpend;
        uint128 committed;
        uint128 vouched;
        uint128 pending;
        uint128 stake;
        uint128 penalty;
        bytes32 planHash;
        uint128 arbiterFee; // per ruled dispute, fixed when the deal opens
        uint128 feesHeld; // the client's fees held by disputes not yet ended
    }

    struct Batch {
        uint128 amount;
        uint64 deadline;
        BatchStatus status;
        uint32 tasks;
    }

    /// @dev One word of task flags: bit `i` stands for task `word * 256 + i`.
    struct TaskBits {
        uint256 vouched;
        uint256 claimed;
        uint256 refunded;
    }

    IERC20 private immutable _token;
    uint64 private immutable _minChallengeWindow;
    uint64 private immutable _arbitrationPeriod;
    uint256 private _dealCount;
    mapping(address account => uint256) private _balances;
    mapping(address provider => uint256) private _stakes;
    mapping(address provider => mapping(uint256 word => uint256)) private _usedNonces;
    mapping(uint256 dealId => Deal) private _deals;
    mapping(uint256 dealId => mapping(uint32 batchId => Batch)) private _batches;
    mapping(uint256 dealId => mapping(uint256 word => TaskBits)) private _tasks;
    mapping(address arbiter => uint256) private _arbiterFees;

    /// @param settlementToken The ERC-20 every amount is in.
    /// @param minimumChallengeWindow The shortest challenge window a quote may set (> 0): the time
    /// a provider's daemon has after each deadline to settle, restarts included.
    /// @param arbitrationPeriod_ How long an arbiter has to rule (> 0).
    constructor(IERC20 settlementToken, uint64 minimumChallengeWindow, uint64 arbitrationPeriod_)
        EIP712("ComputeEscrow", "2")
    {
        if (minimumChallengeWindow == 0 || arbitrationPeriod_ == 0) revert EscrowInvalidTerms();
        _token = settlementToken;
        _minChallengeWindow = minimumChallengeWindow;
        _arbitrationPeriod = arbitrationPeriod_;
    }

    // ------------------------------------------------------------------ balances and stake

    /// @inheritdoc IComputeEscrow
    function deposit(uint256 amount) external nonReentrant {
        if (amount == 0) revert EscrowZeroAmount();
        _balances[msg.sender] += amount;
        emit Deposited(msg.sender, amount);
        _token.safeTransferFrom(msg.sender, address(this), amount);
    }

    /// @inheritdoc IComputeEscrow
    function withdraw(uint256 amount) external nonReentrant {
        if (amount == 0) revert EscrowZeroAmount();
        uint256 available = _balances[msg.sender];
        if (amount > available) revert EscrowInsufficientBalance(msg.sender, available, amount);
        // Safe: amount <= available.
        unchecked {
            _balances[msg.sender] = available - amount;
        }
        emit Withdrawn(msg.sender, amount);
        _token.safeTransfer(msg.sender, amount);
    }

    /// @inheritdoc IComputeEscrow
    function stake(uint256 amount) external nonReentrant {
        if (amount == 0) revert EscrowZeroAmount();
        _stakes[msg.sender] += amount;
        emit Staked(msg.sender, amount);
        _token.safeTransferFrom(msg.sender, address(this), amount);
    }

    /// @inheritdoc IComputeEscrow
    function unstake(uint256 amount) external nonReentrant {
        if (amount == 0) revert EscrowZeroAmount();
        uint256 available = _stakes[msg.sender];
        if (amount > available) revert EscrowInsufficientStake(msg.sender, available, amount);
        // Safe: amount <= available.
        unchecked {
            _stakes[msg.sender] = available - amount;
        }
        emit Unstaked(msg.sender, amount);
        _token.safeTransfer(msg.sender, amount);
    }

    // ------------------------------------------------------------------ deals

    /// @inheritdoc IComputeEscrow
    function cancelQuoteNonce(uint256 nonce) external {
        _useNonce(msg.sender, nonce);
        emit QuoteNonceCancelled(msg.sender, nonce);
    }

    /// @inheritdoc IComputeEscrow
    function openDeal(Quote calldata quote, bytes calldata signature, uint256 maxSpend)
        external
        returns (uint256 dealId)
    {
        if (block.timestamp > quote.validUntil) revert EscrowQuoteExpired(quote.validUntil);
        if (quote.client != msg.sender) revert EscrowWrongClient(quote.client, msg.sender);
        if (quote.challengeWindow < _minChallengeWindow) {
            revert EscrowChallengeWindowTooShort(quote.challengeWindow, _minChallengeWindow);
        }
        if (maxSpend == 0) revert EscrowZeroAmount();
        if (maxSpend > quote.maxSpend) revert EscrowSpendAboveQuote(maxSpend, quote.maxSpend);
        if (!PlanPricing.isValid(quote.plan)) revert EscrowInvalidPlan();
        if (
            quote.arbiter == address(0) || quote.arbiter == quote.provider || quote.arbiter == msg.sender
                || quote.duration == 0 || quote.plan.reservationFee > maxSpend
                || maxSpend > type(uint128).max || quote.stake > type(uint128).max || quote.penalty > type(uint128).max
                || block.timestamp + quote.duration + 3 * uint256(quote.challengeWindow) + _arbitrationPeriod
                    > type(uint64).max
        ) revert EscrowInvalidTerms();
        bytes32 quoteHash = quote.hash();
        _checkSigner(_hashTypedDataV4(quoteHash), signature, quote.provider);
        _useNonce(quote.provider, quote.nonce);

        uint256 available = _balances[msg.sender];
        if (maxSpend > available) revert EscrowInsufficientBalance(msg.sender, available, maxSpend);
        uint256 lockedStake_ = lockedStake(quote.stake, quote.maxSpend, maxSpend);
        uint256 freeStake = _stakes[quote.provider];
        if (lockedStake_ > freeStake) revert EscrowInsufficientStake(quote.provider, freeStake, lockedStake_);

        dealId = ++_dealCount;
        uint64 expiry = uint64(block.timestamp) + quote.duration;
        uint64 fee = quote.plan.reservationFee;
        // Safe: both amounts were checked against the balances they come from.
        unchecked {
            _balances[msg.sender] = available - maxSpend;
            _stakes[quote.provider] = freeStake - lockedStake_;
        }
        if (fee != 0) _balances[quote.provider] += fee;
        bytes32 planHash_ = quote.plan.hash();
        Deal storage deal = _deals[dealId];
        deal.client = msg.sender;
        deal.expiry = expiry;
        deal.status = DealStatus.Open;
        deal.provider = quote.provider;
        deal.challengeWindow = quote.challengeWindow;
        deal.arbiter = quote.arbiter;
        deal.maxSpend = uint128(maxSpend);
        deal.committed = fee;
        deal.stake = uint128(lockedStake_);
        deal.penalty = uint128(quote.penalty);
        deal.planHash = planHash_;
        uint256 arbiterFee_ = _arbiterFees[quote.arbiter];
        if (arbiterFee_ != 0) deal.arbiterFee = uint128(arbiterFee_);
        emit DealOpened(
            dealId,
            msg.sender,
            quote.provider,
            quote.arbiter,
            maxSpend,
            lockedStake_,
            quote.penalty,
            expiry,
            quote.challengeWindow,
            quote.sloMs,
            planHash_,
            quoteHash
        );
        if (fee != 0) emit ReservationFeePaid(dealId, quote.provider, fee);
    }

    // ------------------------------------------------------------------ cooperative payment

    /// @inheritdoc IComputeEscrow
    function redeemVoucher(Voucher calldata voucher, bytes calldata signature) external {
        uint256 dealId = voucher.dealId;
        Deal storage deal = _open(dealId);
        if (msg.sender != deal.provider) revert EscrowUnauthorized(msg.sender);
        _checkSigner(_hashTypedDataV4(voucher.hash()), signature, deal.client);
        uint256 redeemed = deal.vouched;
        uint256 cumulative = voucher.cumulativeAmount;
        if (cumulative <= redeemed) revert EscrowStaleVoucher(dealId, cumulative, redeemed);
        // Safe: cumulative > redeemed.
        uint256 increase;
        unchecked {
            increase = cumulative - redeemed;
        }
        uint256 committed = deal.committed;
        _checkCap(dealId, deal, increase);

        uint256 words = voucher.tasks.length;
        if (words > MAX_TASKS / 256) revert EscrowTaskIndexTooLarge(words * 256);
        uint256[] memory newTasks = new uint256[](words);
        for (uint256 w; w < words; ++w) {
            uint256 bits = voucher.tasks[w];
            if (bits == 0) continue;
            TaskBits storage flags = _tasks[dealId][w];
            uint256 fresh = bits & ~flags.vouched;
            if (fresh == 0) continue;
            uint256 conflict = fresh & (flags.claimed | flags.refunded);
            if (conflict != 0) revert EscrowTaskAlreadySettled(dealId, _taskAt(w, conflict));
            flags.vouched |= fresh;
            newTasks[w] = fresh;
        }

        // Safe: _checkCap bounded committed + pending + increase by maxSpend < 2^128.
        deal.vouched = uint128(cumulative);
        deal.committed = uint128(committed + increase);
        _balances[deal.provider] += increase;
        emit VoucherRedeemed(dealId, cumulative, increase, newTasks);
    }

    // ------------------------------------------------------------------ silent client

    /// @inheritdoc IComputeEscrow
    function claimReceipts(uint256 dealId, Plan calldata plan, Claim[] calldata claims)
        external
        returns (uint32 batchId)
    {
        Deal storage deal = _open(dealId);
        if (msg.sender != deal.provider) revert EscrowUnauthorized(msg.sender);
        if (plan.hash() != deal.planHash) revert EscrowPlanMismatch(dealId);
        uint256 count = claims.length;
        if (count == 0 || count > MAX_TASKS) revert EscrowBadBatch();
        address client = deal.client;
        uint256 expiry = deal.expiry;
        uint256 window = deal.challengeWindow;

        uint256 total;
        uint256 word = type(uint256).max;
        uint256 claimed;
        uint256 taken;
        uint32[] memory indexes = new uint32[](count);
        for (uint256 i; i < count; ++i) {
            Claim calldata claim = claims[i];
            Receipt calldata receipt = claim.receipt;
            uint32 taskIndex = receipt.taskIndex;
            _checkClaim(dealId, receipt, expiry, window);
            uint256 priced = PlanPricing.price(
                plan, receipt.kind, receipt.status, receipt.cacheHit, receipt.deviceMs, taskIndex
            );
            if (receipt.amount != priced) revert EscrowAmountMismatch(taskIndex, receipt.amount, priced);
            if (priced > claim.maxPrice) revert EscrowPriceAboveRequest(taskIndex, priced, claim.maxPrice);
            _checkSigner(
                _hashTypedDataV4(MessageHashing.requestHash(receipt, claim.maxPrice)), claim.requestSignature, client
            );

            uint256 w = taskIndex >> 8;
            if (w != word) {
                if (word != type(uint256).max) _tasks[dealId][word].claimed = claimed;
                TaskBits storage flags = _tasks[dealId][w];
                claimed = flags.claimed;
                taken = flags.vouched | flags.refunded;
                word = w;
            }
            uint256 bit = 1 << (taskIndex & 255);
            if ((claimed | taken) & bit != 0) revert EscrowTaskAlreadySettled(dealId, taskIndex);
            claimed |= bit;
            indexes[i] = taskIndex;
            total += priced;
        }
        _tasks[dealId][word].claimed = claimed;

        _checkCap(dealId, deal, total);
        // Safe: _checkCap bounded committed + pending + total by maxSpend < 2^128.
        deal.pending = uint128(deal.pending + total);
        batchId = deal.batchCount++;
        // Safe: now <= expiry + window, and openDeal bounded expiry + 3 windows below 2^64.
        uint64 deadline = uint64(block.timestamp + window);
        _batches[dealId][batchId] =
            Batch({amount: uint128(total), deadline: deadline, status: BatchStatus.Pending, tasks: uint32(count)});
        emit ReceiptsClaimed(dealId, batchId, total, indexes, deadline);
    }

    /// @inheritdoc IComputeEscrow
    function finalizeClaim(uint256 dealId, uint32 batchId) external {
        Deal storage deal = _open(dealId);
        Batch storage batch = _batch(dealId, batchId, BatchStatus.Pending);
        if (block.timestamp < batch.deadline) revert EscrowChallengeWindowOpen(batch.deadline);
        batch.status = BatchStatus.Paid;
        _payBatch(deal, batch.amount);
        emit ClaimFinalized(dealId, batchId, batch.amount);
    }

    /// @inheritdoc IComputeEscrow
    function disputeClaim(uint256 dealId, uint32 batchId) external {
        Deal storage deal = _open(dealId);
        if (msg.sender != deal.client) revert EscrowUnauthorized(msg.sender);
        Batch storage batch = _batch(dealId, batchId, BatchStatus.Pending);
        if (block.timestamp >= batch.deadline) revert EscrowChallengeWindowClosed(batch.deadline);
        // Safe: now < batch deadline <= expiry + 2 windows; openDeal bounded that plus arbitration.
        uint64 deadline = uint64(block.timestamp) + _arbitrationPeriod;
        batch.status = BatchStatus.Disputed;
        batch.deadline = deadline;
        uint256 fee = deal.arbiterFee;
        if (fee != 0) {
            uint256 available = _balances[msg.sender];
            if (fee > available) revert EscrowInsufficientBalance(msg.sender, available, fee);
            // Safe: checked against the balance; feesHeld counts one fee per open dispute, each
            // of them below 2^128, and no more disputes than 2^32 batches.
            unchecked {
                _balances[msg.sender] = available - fee;
            }
            deal.feesHeld += uint128(fee);
        }
        emit ClaimDisputed(dealId, batchId, deadline);
    }

    /// @inheritdoc IComputeEscrow
    function resolveDispute(uint256 dealId, uint32 batchId, bool providerWins) external {
        Deal storage deal = _open(dealId);
        if (msg.sender != deal.arbiter) revert EscrowUnauthorized(msg.sender);
        uint64 deadline = _batch(dealId, batchId, BatchStatus.Disputed).deadline;
        if (block.timestamp >= deadline) revert EscrowArbitrationOver(deadline);
        _endDispute(dealId, deal, batchId, providerWins, true);
    }

    /// @inheritdoc IComputeEscrow
    function lapseDispute(uint256 dealId, uint32 batchId) external {
        Deal storage deal = _open(dealId);
        uint64 deadline = _batch(dealId, batchId, BatchStatus.Disputed).deadline;
        if (block.timestamp < deadline) revert EscrowArbitrationOpen(deadline);
        _endDispute(dealId, deal, batchId, false, false);
    }

    // ------------------------------------------------------------------ SLO breach

    /// @inheritdoc IComputeEscrow
    function refundBreach(TaskRequest calldata request, Ack calldata ack, bytes calldata ackSignature) external {
        uint256 dealId = ack.dealId;
        Deal storage deal = _open(dealId);
        if (msg.sender != deal.client) revert EscrowUnauthorized(msg.sender);
        uint32 taskIndex = ack.taskIndex;
        if (request.dealId != dealId || request.taskIndex != taskIndex || ack.requestHash != request.hash()) {
            revert EscrowAckMismatch(taskIndex);
        }
        if (taskIndex >= MAX_TASKS) revert EscrowTaskIndexTooLarge(taskIndex);
        _checkSigner(_hashTypedDataV4(ack.hash()), ackSignature, deal.provider);
        uint256 refundableAt = _settleBy(request.deadline, deal.expiry, deal.challengeWindow);
        if (block.timestamp <= refundableAt) revert EscrowDeadlineNotPassed(refundableAt);
        TaskBits storage flags = _tasks[dealId][taskIndex >> 8];
        uint256 bit = 1 << (taskIndex & 255);
        if ((flags.vouched | flags.claimed | flags.refunded) & bit != 0) {
            revert EscrowTaskAlreadySettled(dealId, taskIndex);
        }
        flags.refunded |= bit;
        (uint256 refund, uint256 penalty) = _refund(deal, ack.price, 1);
        emit BreachRefunded(dealId, taskIndex, refund, penalty);
    }

    // ------------------------------------------------------------------ close

    /// @inheritdoc IComputeEscrow
    function closeDeal(uint256 dealId) external {
        Deal storage deal = _open(dealId);
        // Safe from overflow: openDeal bounded expiry + 3 windows + arbitration below 2^64.
        // A unilateral close waits a full window past the last settlement instant (expiry + window),
        // so every breach stays refundable for at least one window.
        uint64 window = deal.challengeWindow;
        uint64 closableAt = deal.expiry + 2 * window;
        if (block.timestamp < closableAt) {
            // An agreement counts while in force (it lapses CLOSE_AGREEMENT_WINDOWS after it was
            // given), so an old one cannot close a deal between a later breach and its refund.
            // Safe: block.timestamp < closableAt < 2^64.
            uint48 now_ = uint48(block.timestamp);
            bool party;
            if (msg.sender == deal.client) {
                deal.clientAgreedCloseAt = now_;
                party = true;
            }
            if (msg.sender == deal.provider) {
                deal.providerAgreedCloseAt = now_;
                party = true;
            }
            if (!party) revert EscrowUnauthorized(msg.sender);
            emit CloseAgreed(dealId, msg.sender);
            if (!(_agreementInForce(deal.clientAgreedCloseAt, window)
                        && _agreementInForce(deal.providerAgreedCloseAt, window))) return;
        } else if (msg.sender != deal.client && msg.sender != deal.provider) {
            revert EscrowUnauthorized(msg.sender);
        }
        if (deal.pending != 0) revert EscrowClaimsPending(dealId, deal.pending);

        uint256 returned = deal.maxSpend - deal.committed;
        uint256 stakeLeft = deal.stake;
        deal.status = DealStatus.Closed;
        deal.committed = deal.maxSpend;
        deal.stake = 0;
        _balances[deal.client] += returned;
        _stakes[deal.provider] += stakeLeft;
        emit DealClosed(dealId, returned, stakeLeft);
    }

    /// @inheritdoc IComputeEscrow
    function withdrawCloseAgreement(uint256 dealId) external {
        Deal storage deal = _open(dealId);
        bool party;
        if (msg.sender == deal.client) {
            deal.clientAgreedCloseAt = 0;
            party = true;
        }
        if (msg.sender == deal.provider) {
            deal.providerAgreedCloseAt = 0;
            party = true;
        }
        if (!party) revert EscrowUnauthorized(msg.sender);
        emit CloseAgreementWithdrawn(dealId, msg.sender);
    }

    // ------------------------------------------------------------------ arbiter fee

    /// @inheritdoc IComputeEscrow
    function setArbiterFee(uint256 fee) external {
        if (fee > type(uint128).max) revert EscrowInvalidTerms();
        _arbiterFees[msg.sender] = fee;
        emit ArbiterFeeSet(msg.sender, fee);
    }

    /// @inheritdoc IComputeEscrow
    function arbiterFee(address arbiter) external view returns (uint256) {
        return _arbiterFees[arbiter];
    }

    /// @inheritdoc IComputeEscrow
    function dealArbiterFee(uint256 dealId) external view returns (uint256 fee, uint256 held) {
        Deal storage deal = _deals[dealId];
        return (deal.arbiterFee, deal.feesHeld);
    }

    // ------------------------------------------------------------------ views

    /// @inheritdoc IComputeEscrow
    function token() external view returns (address) {
        return address(_token);
    }

    /// @inheritdoc IComputeEscrow
    function balanceOf(address account) external view returns (uint256) {
        return _balances[account];
    }

    /// @inheritdoc IComputeEscrow
    function stakeOf(address provider) external view returns (uint256) {
        return _stakes[provider];
    }

    /// @inheritdoc IComputeEscrow
    function isNonceUsed(address provider, uint256 nonce) external view returns (bool) {
        return _usedNonces[provider][nonce >> 8] & (1 << (nonce & 255)) != 0;
    }

    /// @inheritdoc IComputeEscrow
    function getDeal(uint256 dealId) external view returns (DealView memory view_) {
        Deal storage deal = _deals[dealId];
        if (deal.status == DealStatus.None) revert EscrowDealNotFound(dealId);
        view_ = DealView({
            client: deal.client,
            provider: deal.provider,
            arbiter: deal.arbiter,
            status: deal.status,
            expiry: deal.expiry,
            challengeWindow: deal.challengeWindow,
            maxSpend: deal.maxSpend,
            committed: deal.committed,
            vouched: deal.vouched,
            pending: deal.pending,
            stake: deal.stake,
            penalty: deal.penalty,
            planHash: deal.planHash,
            batchCount: deal.batchCount,
            clientAgreedClose: _agreementInForce(deal.clientAgreedCloseAt, deal.challengeWindow),
            providerAgreedClose: _agreementInForce(deal.providerAgreedCloseAt, deal.challengeWindow)
        });
    }

    /// @inheritdoc IComputeEscrow
    function getBatch(uint256 dealId, uint32 batchId) external view returns (BatchView memory) {
        Batch storage batch = _batches[dealId][batchId];
        if (batch.status == BatchStatus.None) revert EscrowBatchNotFound(dealId, batchId);
        return BatchView({amount: batch.amount, deadline: batch.deadline, status: batch.status, tasks: batch.tasks});
    }

    /// @inheritdoc IComputeEscrow
    function minChallengeWindow() external view returns (uint64) {
        return _minChallengeWindow;
    }

    /// @inheritdoc IComputeEscrow
    function arbitrationPeriod() external view returns (uint64) {
        return _arbitrationPeriod;
    }

    /// @inheritdoc IComputeEscrow
    function taskStatus(uint256 dealId, uint32 taskIndex) external view returns (TaskStatus) {
        if (taskIndex >= MAX_TASKS) revert EscrowTaskIndexTooLarge(taskIndex);
        TaskBits storage flags = _tasks[dealId][taskIndex >> 8];
        uint256 bit = 1 << (taskIndex & 255);
        if (flags.vouched & bit != 0) return TaskStatus.Vouched;
        if (flags.claimed & bit != 0) return TaskStatus.Claimed;
        if (flags.refunded & bit != 0) return TaskStatus.Refunded;
        return TaskStatus.None;
    }

    /// @inheritdoc IComputeEscrow
    function dealCount() external view returns (uint256) {
        return _dealCount;
    }

    /// @inheritdoc IComputeEscrow
    function lockedStake(uint256 quoteStake, uint256 quoteMaxSpend, uint256 maxSpend) public pure returns (uint256) {
        if (maxSpend > quoteMaxSpend) revert EscrowSpendAboveQuote(maxSpend, quoteMaxSpend);
        if (quoteStake > type(uint128).max || maxSpend > type(uint128).max) revert EscrowInvalidTerms();
        // Safe: both factors are below 2^128, so the product fits; a non-zero product means
        // quoteMaxSpend >= maxSpend > 0.
        uint256 product = quoteStake * maxSpend;
        return product == 0 ? 0 : (product - 1) / quoteMaxSpend + 1;
    }

    /// @inheritdoc IComputeEscrow
    function price(Plan calldata plan, uint8 kind, uint8 status, bool cacheHit, uint64 deviceMs, uint32 taskIndex)
        external
        pure
        returns (uint256)
    {
        return PlanPricing.price(plan, kind, status, cacheHit, deviceMs, taskIndex);
    }

    /// @inheritdoc IComputeEscrow
    function quoteDigest(Quote calldata quote) external view returns (bytes32) {
        return _hashTypedDataV4(quote.hash());
    }

    /// @inheritdoc IComputeEscrow
    function taskRequestDigest(TaskRequest calldata request) external view returns (bytes32) {
        return _hashTypedDataV4(request.hash());
    }

    /// @inheritdoc IComputeEscrow
    function ackDigest(Ack calldata ack) external view returns (bytes32) {
        return _hashTypedDataV4(ack.hash());
    }

    /// @inheritdoc IComputeEscrow
    function receiptDigest(Receipt calldata receipt) external view returns (bytes32) {
        return _hashTypedDataV4(receipt.hash());
    }

    /// @inheritdoc IComputeEscrow
    function voucherDigest(Voucher calldata voucher) external view returns (bytes32) {
        return _hashTypedDataV4(voucher.hash());
    }

    /// @inheritdoc IComputeEscrow
    function planHash(Plan calldata plan) external pure returns (bytes32) {
        return plan.hash();
    }

    // ------------------------------------------------------------------ internals

    function _open(uint256 dealId) private view returns (Deal storage deal) {
        deal = _deals[dealId];
        if (deal.status != DealStatus.Open) {
            if (deal.status == DealStatus.None) revert EscrowDealNotFound(dealId);
            revert EscrowDealNotOpen(dealId);
        }
    }

    function _batch(uint256 dealId, uint32 batchId, BatchStatus expected) private view returns (Batch storage batch) {
        batch = _batches[dealId][batchId];
        if (batch.status == BatchStatus.None) revert EscrowBatchNotFound(dealId, batchId);
        if (batch.status != expected) revert EscrowBatchWrongStatus(dealId, batchId, batch.status);
    }

    function _endDispute(uint256 dealId, Deal storage deal, uint32 batchId, bool providerWins, bool ruled)
        private
    {
        Batch storage batch = _batch(dealId, batchId, BatchStatus.Disputed);
        uint256 amount = batch.amount;
        uint256 refund;
        uint256 penalty;
        if (providerWins) {
            batch.status = BatchStatus.Paid;
            _payBatch(deal, amount);
        } else {
            batch.status = BatchStatus.Rejected;
            deal.pending -= uint128(amount);
            (refund, penalty) = _refund(deal, amount, batch.tasks);
        }
        emit DisputeResolved(dealId, batchId, providerWins, amount, refund, penalty);
        uint256 fee = deal.arbiterFee;
        if (fee != 0) _settleFee(dealId, deal, batchId, fee, ruled && providerWins, ruled && !providerWins);
    }

    /// @dev Release the fee the client held for a dispute: to the arbiter if the client lost the
    /// ruling, else back to the client; if the provider lost the ruling, it pays the fee from the
    /// stake left after the penalty (capped by it).
    function _settleFee(uint256 dealId, Deal storage deal, uint32 batchId, uint256 fee, bool clientLost, bool providerLost)
        private
    {
        // Safe: the dispute that ends held exactly this fee.
        unchecked {
            deal.feesHeld -= uint128(fee);
        }
        address arbiter = deal.arbiter;
        if (clientLost) {
            _balances[arbiter] += fee;
            emit ArbiterFeePaid(dealId, batchId, arbiter, deal.client, fee);
            return;
        }
        _balances[deal.client] += fee;
        if (!providerLost) return;
        uint256 stakeLeft = deal.stake;
        uint256 paid = fee < stakeLeft ? fee : stakeLeft;
        // Safe: paid <= stakeLeft.
        unchecked {
            deal.stake = uint128(stakeLeft - paid);
        }
        _balances[arbiter] += paid;
        emit ArbiterFeePaid(dealId, batchId, arbiter, deal.provider, paid);
    }

    /// @dev Unlock `amount` of the deal's funds for the client (capped by what is unspent) and pay
    /// it the penalty `tasks` times (capped by the stake left).
    function _refund(Deal storage deal, uint256 amount, uint256 tasks)
        private
        returns (uint256 refund, uint256 penalty)
    {
        uint256 committed = deal.committed;
        uint256 unspent = deal.maxSpend - committed - deal.pending;
        refund = amount < unspent ? amount : unspent;
        uint256 stakeLeft = deal.stake;
        // Safe from overflow: penalty < 2^128 and tasks <= 65,536.
        penalty = uint256(deal.penalty) * tasks;
        if (penalty > stakeLeft) penalty = stakeLeft;
        // Safe: refund <= unspent, so committed + refund <= maxSpend < 2^128; penalty <= stakeLeft.
        deal.committed = uint128(committed + refund);
        unchecked {
            deal.stake = uint128(stakeLeft - penalty);
        }
        _balances[deal.client] += refund + penalty;
    }

    /// @dev Check one claimed task against its deal and timing: the receipt's deadline is the
    /// request's (the client signs it), and the claim lands by the task's settlement instant.
    function _checkClaim(uint256 dealId, Receipt calldata receipt, uint256 expiry, uint256 window)
        private
        view
    {
        uint32 taskIndex = receipt.taskIndex;
        if (receipt.dealId != dealId) revert EscrowReceiptForOtherDeal(dealId, receipt.dealId);
        if (taskIndex >= MAX_TASKS) revert EscrowTaskIndexTooLarge(taskIndex);
        if (receipt.finishedAt > receipt.deadline) {
            revert EscrowReceiptLate(taskIndex, receipt.finishedAt, receipt.deadline);
        }
        uint256 settleBy = _settleBy(receipt.deadline, expiry, window);
        if (block.timestamp > settleBy) revert EscrowClaimPeriodOver(taskIndex, settleBy);
    }

    /// @dev The instant a task settles: until it the provider may claim, after it the client may
    /// refund. The deadline counts at most up to the deal's expiry.
    function _settleBy(uint256 deadline, uint256 expiry, uint256 window) private pure returns (uint256) {
        return (deadline < expiry ? deadline : expiry) + window;
    }

    function _payBatch(Deal storage deal, uint256 amount) private {
        deal.pending -= uint128(amount);
        deal.committed += uint128(amount);
        _balances[deal.provider] += amount;
    }

    /// @dev Revert unless `amount` more fits the deal's cap; written so no sum can overflow.
    function _checkCap(uint256 dealId, Deal storage deal, uint256 amount) private view {
        uint256 cap = deal.maxSpend;
        uint256 used = uint256(deal.committed) + deal.pending;
        // Safe: committed + pending <= cap always holds.
        unchecked {
            if (amount > cap - used) {
                revert EscrowCapExceeded(dealId, cap, amount > type(uint256).max - used ? type(uint256).max : used + amount);
            }
        }
    }

    function _useNonce(address provider, uint256 nonce) private {
        uint256 bit = 1 << (nonce & 255);
        uint256 word = _usedNonces[provider][nonce >> 8];
        if (word & bit != 0) revert EscrowNonceUsed(provider, nonce);
        _usedNonces[provider][nonce >> 8] = word | bit;
    }

    function _checkSigner(bytes32 digest, bytes calldata signature, address expected) private view {
        if (!SignerCheck.isValid(expected, digest, signature)) revert EscrowInvalidSignature(expected);
    }

    /// @dev Whether an early-close agreement given at `agreedAt` (0: none) is in force now.
    function _agreementInForce(uint48 agreedAt, uint64 window) private view returns (bool) {
        return agreedAt != 0 && block.timestamp < uint256(agreedAt) + CLOSE_AGREEMENT_WINDOWS * window;
    }

    function _taskAt(uint256 word, uint256 bits) private pure returns (uint32) {
        uint256 index;
        while (bits & 1 == 0) {
            bits >>= 1;
            ++index;
        }
        return uint32(word * 256 + index);
    }
}
