// SPDX-License-Identifier: MIT
pragma solidity ^0.8.24;

// Test-only EIP-7702 delegates: an account that delegates its code to one of these answers
// ERC-1271 `isValidSignature` as the delegate says, at its own address.

bytes4 constant ERC1271_MAGIC = 0x1626ba7e;

/// @title RefusingDelegate
/// @notice Says no to every signature: an account delegating to it withdraws what it signed
/// wherever a verifier asks ERC-1271 before ECDSA.
contract RefusingDelegate {
    /// @notice ERC-1271: never the magic value.
    function isValidSignature(bytes32, bytes calldata) external pure returns (bytes4) {
        return 0xffffffff;
    }
}

/// @title GasBurningDelegate
/// @notice Burns all the gas it is given: an account delegating to it makes a verifier that
/// forwards all its gas to ERC-1271 run out of gas.
contract GasBurningDelegate {
    /// @notice ERC-1271: loops until the call's gas is gone.
    function isValidSignature(bytes32, bytes calldata) external pure returns (bytes4) {
        assembly ("memory-safe") {
            for {} 1 {} {}
        }
        return 0xffffffff;
    }
}

/// @title HonestDelegate
/// @notice Answers ERC-1271 truthfully for the key of the account that delegates to it: the
/// magic value when the digest's 65-byte signature recovers to this address.
contract HonestDelegate {
    /// @notice ERC-1271: the magic value when this account's key signed `digest`.
    function isValidSignature(bytes32 digest, bytes calldata signature) external view returns (bytes4) {
        if (signature.length != 65) return 0xffffffff;
        address signer = ecrecover(digest, uint8(signature[64]), bytes32(signature[0:32]), bytes32(signature[32:64]));
        return signer != address(0) && signer == address(this) ? ERC1271_MAGIC : bytes4(0xffffffff);
    }
}
