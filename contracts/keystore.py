"""Keys kept in encrypted keystore files (the JSON keystore, version 3, scrypt) and their CLI.

``tpumarket keys new|import|list`` writes and lists keystores; services read a key from a
keystore with its passphrase taken from a file, an environment variable or a prompt (in that
order of preference). A raw hex key is for development on a local chain only: commands that
take one say so on stderr.
"""

from __future__ import annotations

import argparse
import getpass
import json
import os
import sys
from pathlib import Path
from typing import Any

from contracts.cli import InputError

DEFAULT_DIR = Path.home() / ".tpumarket" / "keys"
PASSPHRASE_ENV = "TPUMARKET_KEYSTORE_PASSPHRASE"
RAW_KEY_WARNING = (
    "warning: a raw private key (development only); keep keys in an encrypted keystore "
    "(`tpumarket keys new`) on a real chain"
)


class KeystoreError(InputError):
    """A keystore that cannot be read, written or decrypted; the message says which and why."""


def read_passphrase(passphrase_file: Path | None = None, *, prompt: str = "passphrase: ") -> str:
    """Return a passphrase from ``passphrase_file``, ``$TPUMARKET_KEYSTORE_PASSPHRASE`` or a
    prompt on the terminal; raise :class:`KeystoreError` when there is none."""
    if passphrase_file is not None:
        try:
            return passphrase_file.read_text().rstrip("\n")
        except OSError as exc:
            raise KeystoreError(f"passphrase file {passphrase_file}: {exc.strerror}") from None
    from_env = os.environ.get(PASSPHRASE_ENV)
    if from_env is not None:
        return from_env
    if not sys.stdin.isatty():
        raise KeystoreError(
            f"no passphrase: give a passphrase file or set {PASSPHRASE_ENV} (no terminal to ask)"
        )
    return getpass.getpass(prompt)


def write_keystore(
    path: Path, private_key: str, passphrase: str, *, scrypt_n: int | None = None
) -> str:
    """Encrypt ``private_key`` into a new keystore file at ``path`` (mode 0600); return its
    address. Refuse to overwrite a file. ``scrypt_n`` (default: the standard 2**18) is the
    key-derivation cost; lower it only for throwaway keys."""
    from eth_account import Account

    if not passphrase:
        raise KeystoreError("an empty passphrase protects nothing")
    if path.exists():
        raise KeystoreError(f"{path} exists: choose another file")
    data = Account.encrypt(
        bytes.fromhex(private_key.removeprefix("0x")), passphrase, iterations=scrypt_n
    )
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        raise KeystoreError(f"{path} exists: choose another file") from None
    with os.fdopen(fd, "w") as out:
        json.dump(data, out)
    return "0x" + str(data["address"]).lower().removeprefix("0x")


def keystore_address(path: Path) -> str:
    """Return the address a keystore file states (without decrypting it)."""
    try:
        data: dict[str, Any] = json.loads(path.read_text())
        return "0x" + str(data["address"]).lower().removeprefix("0x")
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise KeystoreError(f"{path} is not a keystore file: {exc}") from None


def load_key(path: Path, passphrase: str) -> str:
    """Return the private key (0x hex) a keystore file holds; a wrong passphrase is an error."""
    from eth_account import Account

    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise KeystoreError(f"{path} is not a keystore file: {exc}") from None
    try:
        key: bytes = Account.decrypt(data, passphrase)
    except ValueError:
        raise KeystoreError(f"{path}: wrong passphrase (or a damaged keystore)") from None
    return "0x" + key.hex()


def register(commands: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add ``tpumarket keys ...``."""
    keys = commands.add_parser("keys", help="encrypted keystore files for every role")
    actions = keys.add_subparsers(dest="action", required=True)
    new = actions.add_parser("new", help="make a new key in a new keystore file")
    new.add_argument("file", type=Path, help="the keystore file to write (must not exist)")
    new.add_argument("--passphrase-file", type=Path, default=None)
    new.set_defaults(handler=_new)
    imp = actions.add_parser("import", help="encrypt an existing key (read from stdin)")
    imp.add_argument("file", type=Path, help="the keystore file to write (must not exist)")
    imp.add_argument("--passphrase-file", type=Path, default=None)
    imp.set_defaults(handler=_import)
    ls = actions.add_parser("list", help="the addresses of the keystores in a folder")
    ls.add_argument("folder", type=Path, nargs="?", default=DEFAULT_DIR)
    ls.set_defaults(handler=_list)


def _new(args: argparse.Namespace) -> int:
    from eth_account import Account

    address = write_keystore(
        args.file, "0x" + Account.create().key.hex(), read_passphrase(args.passphrase_file)
    )
    print(f"{address} {args.file}")
    return 0


def _import(args: argparse.Namespace) -> int:
    from contracts.cli import check_private_key

    key = check_private_key(sys.stdin.readline(), what="the key on stdin")
    address = write_keystore(args.file, key, read_passphrase(args.passphrase_file))
    print(f"{address} {args.file}")
    return 0


def _list(args: argparse.Namespace) -> int:
    folder: Path = args.folder
    if not folder.is_dir():
        raise KeystoreError(f"{folder} is not a folder")
    for path in sorted(folder.iterdir()):
        if path.is_file():
            try:
                print(f"{keystore_address(path)} {path}")
            except KeystoreError:
                continue
    return 0
