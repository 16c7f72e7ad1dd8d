// SPDX-License-Identifier: MIT
pragma solidity ^0.8.24;

/// @notice An ERC-20 that keeps a fee of at least one unit on every transfer: a deployment
/// must refuse to settle in it.
contract FeeToken {
    mapping(address => uint256) public balanceOf;
    uint8 public constant decimals = 6;

    constructor() {
        balanceOf[msg.sender] = 1e12;
    }

    function transfer(address to, uint256 amount) external returns (bool) {
        uint256 fee = amount / 100 + 1;
        balanceOf[msg.sender] -= amount;
        balanceOf[to] += amount - (fee > amount ? amount : fee);
        return true;
    }
}
