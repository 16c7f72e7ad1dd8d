// SPDX-License-Identifier: MIT
pragma solidity ^0.8.24;

/// @title TestWallet
/// @notice Test-only smart-contract wallet: its owner (a key) sends calls through it, and it
/// answers ERC-1271 `isValidSignature` for digests its owner signed, while it accepts.
contract TestWallet {
    /// @notice Thrown when someone other than the owner uses the wallet.
    error TestWalletUnauthorized(address account);

    bytes4 private constant ERC1271_MAGIC = 0x1626ba7e;
    address private immutable _owner;
    bool private _accepting = true;

    constructor(address owner) {
        _owner = owner;
    }

    /// @notice Call `target` with `data` as this wallet; a revert bubbles up unchanged.
    function execute(address target, bytes calldata data) external returns (bytes memory result) {
        if (msg.sender != _owner) revert TestWalletUnauthorized(msg.sender);
        bool ok;
        (ok, result) = target.call(data);
        if (!ok) {
            assembly ("memory-safe") {
                revert(add(result, 0x20), mload(result))
            }
        }
    }

    /// @notice Accept or refuse every signature from now on (a wallet that says no).
    function setAccepting(bool accepting) external {
        if (msg.sender != _owner) revert TestWalletUnauthorized(msg.sender);
        _accepting = accepting;
    }

    /// @notice ERC-1271: the magic value when the owner signed `digest` and the wallet accepts.
    function isValidSignature(bytes32 digest, bytes calldata signature) external view returns (bytes4) {
        if (!_accepting || signature.length != 65) return 0xffffffff;
        bytes32 r = bytes32(signature[0:32]);
        bytes32 s = bytes32(signature[32:64]);
        uint8 v = uint8(signature[64]);
        address signer = ecrecover(digest, v, r, s);
        return signer != address(0) && signer == _owner ? ERC1271_MAGIC : bytes4(0xffffffff);
    }
}
