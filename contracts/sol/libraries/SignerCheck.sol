// SPDX-License-Identifier: MIT
pragma solidity ^0.8.24;

/// @title SignerCheck
/// @notice Whether `signer` signed `digest`, in an order its signer cannot undo: a 65-byte,
/// low-s ECDSA signature that recovers to the signer is valid whatever code the signer's
/// address has now (an EIP-7702 delegation made after signing changes nothing); only when
/// recovery does not give the signer, and the address has code, is ERC-1271 asked, with at
/// most `ERC1271_GAS_STIPEND` gas. So a true contract wallet's signature is its wallet's word
/// at the time of use (the wallet can withdraw it); a signature that recovers to its signer cannot.
library SignerCheck {
    /// @notice Gas an ERC-1271 `isValidSignature` call may use: enough for a wallet checking a
    /// few ECDSA owners (3,000 gas each) and reading its storage; a wallet that burns more is
    /// refused without taking the caller's transaction down with it.
    uint256 internal constant ERC1271_GAS_STIPEND = 50_000;

    /// @dev The largest `s` of a non-malleable signature (secp256k1n / 2), as OpenZeppelin's ECDSA.
    uint256 private constant HALF_ORDER = 0x7fffffffffffffffffffffffffffffff5d576e7357a4501ddfe92f46681b20a0;
    bytes4 private constant ERC1271_MAGIC = 0x1626ba7e; // isValidSignature(bytes32,bytes)

    /// @notice Return whether `signature` is `signer`'s over `digest` (false for the zero address).
    function isValid(address signer, bytes32 digest, bytes calldata signature) internal view returns (bool) {
        if (signer == address(0)) return false;
        if (signature.length == 65) {
            bytes32 r = bytes32(signature[0:32]);
            bytes32 s = bytes32(signature[32:64]);
            if (uint256(s) <= HALF_ORDER && ecrecover(digest, uint8(signature[64]), r, s) == signer) return true;
        }
        if (signer.code.length == 0) return false;
        return _isValidERC1271(signer, digest, signature);
    }

    function _isValidERC1271(address signer, bytes32 digest, bytes calldata signature)
        private
        view
        returns (bool valid)
    {
        bytes4 selector = ERC1271_MAGIC;
        uint256 stipend = ERC1271_GAS_STIPEND;
        assembly ("memory-safe") {
            let ptr := mload(0x40)
            let length := signature.length
            mstore(ptr, selector)
            mstore(add(ptr, 0x04), digest)
            mstore(add(ptr, 0x24), 0x40)
            mstore(add(ptr, 0x44), length)
            calldatacopy(add(ptr, 0x64), signature.offset, length)
            mstore(add(add(ptr, 0x64), length), 0)
            let padded := shl(5, shr(5, add(length, 0x1f)))
            mstore(0x00, 0)
            let success := staticcall(stipend, signer, ptr, add(padded, 0x64), 0x00, 0x20)
            valid := and(success, and(gt(returndatasize(), 0x1f), eq(mload(0x00), selector)))
        }
    }
}
