"""Keys in encrypted keystore files: written private, listed without decrypting, read back only
with the right passphrase, never overwritten; the CLI's errors are one line and exit 2."""

from __future__ import annotations

import stat
import subprocess
import sys
from pathlib import Path

import pytest

from contracts.keystore import KeystoreError, keystore_address, load_key, write_keystore
from contracts.signing import address_of

KEY = "0x" + "4c" * 32


def test_a_keystore_holds_the_key_for_its_passphrase_only(tmp_path: Path) -> None:
    path = tmp_path / "keys" / "provider.json"
    address = write_keystore(path, KEY, "correct horse", scrypt_n=2**12)
    assert address == address_of(KEY).lower() == keystore_address(path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert KEY[2:] not in path.read_text()
    assert load_key(path, "correct horse") == KEY
    with pytest.raises(KeystoreError, match="wrong passphrase"):
        load_key(path, "battery staple")
    with pytest.raises(KeystoreError, match="exists"):
        write_keystore(path, KEY, "correct horse", scrypt_n=2**12)
    with pytest.raises(KeystoreError, match="empty passphrase"):
        write_keystore(tmp_path / "other.json", KEY, "")


def _cli(
    *args: str, stdin: str = "", env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    code = "import sys, contracts.cli; sys.exit(contracts.cli.main(sys.argv[1:]))"
    return subprocess.run(
        [sys.executable, "-c", code, *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        check=False,
    )


def test_keys_import_then_list_through_the_cli(tmp_path: Path) -> None:
    secret = tmp_path / "passphrase"
    secret.write_text("s3cret\n")
    folder = tmp_path / "keys"
    done = _cli(
        "keys",
        "import",
        str(folder / "client.json"),
        "--passphrase-file",
        str(secret),
        stdin=KEY + "\n",
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split()[0] == address_of(KEY).lower()
    listed = _cli("keys", "list", str(folder))
    assert listed.returncode == 0 and listed.stdout.split() == [
        address_of(KEY).lower(),
        str(folder / "client.json"),
    ]
    assert load_key(folder / "client.json", "s3cret") == KEY
    again = _cli(
        "keys",
        "import",
        str(folder / "client.json"),
        "--passphrase-file",
        str(secret),
        stdin=KEY + "\n",
    )
    assert again.returncode == 2 and again.stderr.count("\n") == 1 and "exists" in again.stderr
    bad = _cli(
        "keys", "import", str(folder / "x.json"), "--passphrase-file", str(secret), stdin="0x12\n"
    )
    assert bad.returncode == 2 and "not a private key" in bad.stderr and "0x12" not in bad.stderr
