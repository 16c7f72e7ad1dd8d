// SPDX-License-Identifier: MIT
pragma solidity ^0.8.24;

import {ERC20} from "@openzeppelin/contracts/token/ERC20/ERC20.sol";

/// @title SettlementToken
/// @notice A 6-decimal stablecoin stand-in for local chains; the deployer mints.
contract SettlementToken is ERC20 {
    /// @notice Thrown when someone other than the deployer mints.
    error SettlementTokenUnauthorized(address account);

    address private immutable _minter;

    constructor() ERC20("Test USD", "TUSD") {
        _minter = msg.sender;
    }

    /// @notice Six decimals, like the stablecoins this stands in for.
    function decimals() public pure override returns (uint8) {
        return 6;
    }

    /// @notice Mint `amount` to `to`. Only the deployer may mint.
    function mint(address to, uint256 amount) external {
        if (msg.sender != _minter) revert SettlementTokenUnauthorized(msg.sender);
        _mint(to, amount);
    }
}
