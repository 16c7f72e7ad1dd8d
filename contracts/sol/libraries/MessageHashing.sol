// SPDX-License-Identifier: MIT
pragma solidity ^0.8.24;

import {Plan, Quote, TaskRequest, Ack, Receipt, Voucher} from "../types/Messages.sol";

/// @title MessageHashing
/// @notice EIP-712 struct hashes of the escrow's signed messages.
/// @dev Every message except Voucher is made of static fields only, so its ABI encoding in
/// calldata is the concatenation of its fields: hashing copies those words after the type hash.
library MessageHashing {
    bytes internal constant PLAN_TYPE =
        "Plan(uint64 pricePerDeviceMs,uint64 compilePrice,uint64 inferencePrice,uint64 reservationFee,"
        "uint16 reservedDiscountBps,uint16 cacheHitDiscountBps,uint32 tier1FromTask,uint16 tier1DiscountBps,"
        "uint32 tier2FromTask,uint16 tier2DiscountBps,bool outcomeBased)";
    bytes32 internal constant PLAN_TYPEHASH = keccak256(PLAN_TYPE);
    bytes32 internal constant QUOTE_TYPEHASH = keccak256(
        abi.encodePacked(
            "Quote(address provider,address client,address arbiter,uint256 maxSpend,uint256 stake,"
            "uint256 penalty,uint64 duration,uint64 challengeWindow,uint64 sloMs,uint64 validUntil,"
            "uint256 nonce,Plan plan)",
            PLAN_TYPE
        )
    );
    bytes32 internal constant TASK_REQUEST_TYPEHASH = keccak256(
        "TaskRequest(uint256 dealId,uint32 taskIndex,uint8 kind,bytes32 programHash,bytes32 inputHash,"
        "uint256 maxPrice,uint64 deadline)"
    );
    bytes32 internal constant ACK_TYPEHASH =
        keccak256("Ack(uint256 dealId,uint32 taskIndex,bytes32 requestHash,uint256 price)");
    bytes32 internal constant RECEIPT_TYPEHASH = keccak256(
        "Receipt(uint256 dealId,uint32 taskIndex,uint8 kind,uint8 status,bool cacheHit,uint64 deviceMs,"
        "uint64 compileMs,bytes32 programHash,bytes32 inputHash,bytes32 outputHash,uint64 startedAt,"
        "uint64 finishedAt,uint64 deadline,uint256 amount,bytes32 prevReceiptHash)"
    );
    bytes32 internal constant VOUCHER_TYPEHASH =
        keccak256("Voucher(uint256 dealId,uint256 cumulativeAmount,uint256[] tasks)");

    uint256 private constant PLAN_WORDS = 11;
    uint256 private constant QUOTE_HEAD_WORDS = 11;
    uint256 private constant TASK_REQUEST_WORDS = 7;
    uint256 private constant ACK_WORDS = 4;
    uint256 private constant RECEIPT_WORDS = 15;

    /// @notice Hash a plan.
    function hash(Plan calldata plan) internal pure returns (bytes32) {
        return _hashStatic(PLAN_TYPEHASH, _offset(plan), PLAN_WORDS);
    }

    /// @notice Hash a quote (its plan hashed as a nested struct).
    function hash(Quote calldata quote) internal pure returns (bytes32 digest) {
        bytes32 typehash = QUOTE_TYPEHASH;
        bytes32 planHash = hash(quote.plan);
        // Safe: reads calldata words of a static struct into scratch memory past the free pointer.
        assembly ("memory-safe") {
            let m := mload(0x40)
            mstore(m, typehash)
            calldatacopy(add(m, 0x20), quote, mul(QUOTE_HEAD_WORDS, 0x20))
            mstore(add(m, mul(add(QUOTE_HEAD_WORDS, 1), 0x20)), planHash)
            digest := keccak256(m, mul(add(QUOTE_HEAD_WORDS, 2), 0x20))
        }
    }

    /// @notice Hash a task request.
    function hash(TaskRequest calldata request) internal pure returns (bytes32) {
        return _hashStatic(TASK_REQUEST_TYPEHASH, _offset(request), TASK_REQUEST_WORDS);
    }

    /// @notice Hash the task request a receipt answers: its fields from the receipt, and the
    /// client's `maxPrice` (a request's deadline is the receipt's).
    function requestHash(Receipt calldata receipt, uint256 maxPrice) internal pure returns (bytes32 digest) {
        bytes32 typehash = TASK_REQUEST_TYPEHASH;
        // Safe: reads calldata words of a static struct into scratch memory past the free pointer.
        // Receipt words: 0 dealId, 1 taskIndex, 2 kind, 7 programHash, 8 inputHash, 12 deadline.
        assembly ("memory-safe") {
            let m := mload(0x40)
            mstore(m, typehash)
            calldatacopy(add(m, 0x20), receipt, 0x60)
            calldatacopy(add(m, 0x80), add(receipt, 0xe0), 0x40)
            mstore(add(m, 0xc0), maxPrice)
            calldatacopy(add(m, 0xe0), add(receipt, 0x180), 0x20)
            digest := keccak256(m, 0x100)
        }
    }

    /// @notice Hash an ack.
    function hash(Ack calldata ack) internal pure returns (bytes32) {
        return _hashStatic(ACK_TYPEHASH, _offset(ack), ACK_WORDS);
    }

    /// @notice Hash a usage receipt.
    function hash(Receipt calldata receipt) internal pure returns (bytes32) {
        return _hashStatic(RECEIPT_TYPEHASH, _offset(receipt), RECEIPT_WORDS);
    }

    /// @notice Hash a voucher (its task bitmap hashed as a packed array).
    function hash(Voucher calldata voucher) internal pure returns (bytes32) {
        return keccak256(
            abi.encode(
                VOUCHER_TYPEHASH, voucher.dealId, voucher.cumulativeAmount, keccak256(abi.encodePacked(voucher.tasks))
            )
        );
    }

    function _offset(Plan calldata plan) private pure returns (uint256 offset) {
        assembly ("memory-safe") {
            offset := plan
        }
    }

    function _offset(TaskRequest calldata request) private pure returns (uint256 offset) {
        assembly ("memory-safe") {
            offset := request
        }
    }

    function _offset(Ack calldata ack) private pure returns (uint256 offset) {
        assembly ("memory-safe") {
            offset := ack
        }
    }

    function _offset(Receipt calldata receipt) private pure returns (uint256 offset) {
        assembly ("memory-safe") {
            offset := receipt
        }
    }

    function _hashStatic(bytes32 typehash, uint256 offset, uint256 words) private pure returns (bytes32 digest) {
        // Safe: writes only scratch memory past the free memory pointer, which it does not move.
        assembly ("memory-safe") {
            let m := mload(0x40)
            mstore(m, typehash)
            calldatacopy(add(m, 0x20), offset, mul(words, 0x20))
            digest := keccak256(m, mul(add(words, 1), 0x20))
        }
    }
}
