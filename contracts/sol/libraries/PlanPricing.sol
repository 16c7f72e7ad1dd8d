// SPDX-License-Identifier: MIT
pragma solidity ^0.8.24;

import {Plan, KIND_COMPILE, STATUS_SUCCESS} from "../types/Messages.sol";

/// @title PlanPricing
/// @notice The price of one task under a plan; `contracts.pricing` in Python mirrors it exactly.
library PlanPricing {
    uint256 internal constant BPS = 10_000;

    /// @notice Whether every discount is at most 100% and the volume tiers are ordered.
    function isValid(Plan calldata plan) internal pure returns (bool) {
        return plan.reservedDiscountBps <= BPS && plan.cacheHitDiscountBps <= BPS && plan.tier1DiscountBps <= BPS
            && plan.tier2DiscountBps <= BPS
            && (plan.tier2FromTask == 0 || plan.tier1FromTask == 0 || plan.tier2FromTask > plan.tier1FromTask);
    }

    /// @notice Price one task: flat part by kind plus metered part, then the discounts in order.
    /// @param kind KIND_COMPILE or KIND_INFERENCE.
    /// @param status STATUS_SUCCESS or a failure category code.
    function price(Plan calldata plan, uint8 kind, uint8 status, bool cacheHit, uint64 deviceMs, uint32 taskIndex)
        internal
        pure
        returns (uint256 amount)
    {
        if (plan.outcomeBased && kind == KIND_COMPILE && status != STATUS_SUCCESS) return 0;
        amount = uint256(kind == KIND_COMPILE ? plan.compilePrice : plan.inferencePrice)
            + uint256(plan.pricePerDeviceMs) * deviceMs;
        if (plan.tier2FromTask != 0 && taskIndex >= plan.tier2FromTask) {
            amount = amount * (BPS - plan.tier2DiscountBps) / BPS;
        } else if (plan.tier1FromTask != 0 && taskIndex >= plan.tier1FromTask) {
            amount = amount * (BPS - plan.tier1DiscountBps) / BPS;
        }
        if (cacheHit) amount = amount * (BPS - plan.cacheHitDiscountBps) / BPS;
        amount = amount * (BPS - plan.reservedDiscountBps) / BPS;
    }
}
