// SPDX-License-Identifier: MIT
pragma solidity ^0.8.24;

// Task kinds a provider sells.
uint8 constant KIND_COMPILE = 0;
uint8 constant KIND_INFERENCE = 1;

// Receipt status code meaning the task succeeded; any other value is a failure category.
uint8 constant STATUS_SUCCESS = 0;

/// @notice How a deal prices each task. Every component is optional; Python mirrors it exactly.
/// @dev Discounts are in basis points and apply in order: volume tier, cache hit, reservation.
struct Plan {
    uint64 pricePerDeviceMs; // metered part: base units per device-millisecond
    uint64 compilePrice; // flat part for a compile task
    uint64 inferencePrice; // flat part for an inference task
    uint64 reservationFee; // paid to the provider when the deal opens
    uint16 reservedDiscountBps; // discount on every task of a reserved deal
    uint16 cacheHitDiscountBps; // discount when the compile cache was hit
    uint32 tier1FromTask; // tasks with index >= this get tier 1 (0 = no tier)
    uint16 tier1DiscountBps;
    uint32 tier2FromTask; // tasks with index >= this get tier 2 (0 = no tier)
    uint16 tier2DiscountBps;
    bool outcomeBased; // a failed compile task is free
}

/// @notice Terms a provider signs; a client opens a deal with it.
struct Quote {
    address provider;
    address client; // the one client that may open the deal (a quote per fill)
    address arbiter;
    uint256 maxSpend; // the most the provider accepts as the deal's cap
    uint256 stake; // provider stake locked for the deal
    uint256 penalty; // paid to the client per SLO breach, from the stake
    uint64 duration; // seconds from opening to expiry
    uint64 challengeWindow; // seconds after a task's deadline the provider has to settle it, and a
        // claim waits for disputes; at least the escrow's minimum
    uint64 sloMs; // promised latency from ack to delivery
    uint64 validUntil; // the quote cannot open a deal after this time
    uint256 nonce;
    Plan plan;
}

/// @notice A client's signed request to run one task of a deal.
struct TaskRequest {
    uint256 dealId;
    uint32 taskIndex;
    uint8 kind;
    bytes32 programHash;
    bytes32 inputHash;
    uint256 maxPrice; // the most the client pays for this task
    uint64 deadline; // unix seconds by which the result must be delivered
}

/// @notice A provider's signed acceptance of a task request: it commits to the request's
/// deadline at this price.
struct Ack {
    uint256 dealId;
    uint32 taskIndex;
    bytes32 requestHash; // EIP-712 struct hash of the TaskRequest
    uint256 price; // unlocked for the client if the deadline is breached
}

/// @notice A provider's signed account of one executed task.
struct Receipt {
    uint256 dealId;
    uint32 taskIndex;
    uint8 kind;
    uint8 status; // STATUS_SUCCESS or a failure category code
    bool cacheHit;
    uint64 deviceMs;
    uint64 compileMs;
    bytes32 programHash;
    bytes32 inputHash;
    bytes32 outputHash;
    uint64 startedAt;
    uint64 finishedAt;
    uint64 deadline; // the request's deadline
    uint256 amount; // the plan's price for this usage
    bytes32 prevReceiptHash;
}

/// @notice A client's signed, cumulative promise to pay: the total owed and the tasks it covers.
/// @dev Bit `i % 256` of word `i / 256` of `tasks` marks task `i` as paid by this voucher.
struct Voucher {
    uint256 dealId;
    uint256 cumulativeAmount;
    uint256[] tasks;
}

/// @notice One task a provider claims when the client is silent: its receipt and the client's
/// signature over the request it answers, rebuilt from the receipt's fields and `maxPrice`.
struct Claim {
    Receipt receipt;
    uint256 maxPrice; // the request's maxPrice
    bytes requestSignature; // the client's signature over the TaskRequest
}
