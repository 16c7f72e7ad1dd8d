"""Local anvil chain harness: start on a free loopback port, wait, fund, stop by PID."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from eth_account import Account

from contracts.errors import ChainError
from contracts.signing import address_of
from services.lifetime import dies_with_parent

REPO_ROOT = Path(__file__).resolve().parent.parent
ANVIL_BINARY = REPO_ROOT / "node_modules" / "@foundry-rs" / "anvil-linux-amd64" / "bin" / "anvil"
DEV_MNEMONIC = "test test test test test test test test test test test junk"
DEFAULT_CHAIN_ID = 31337
START_TIMEOUT_S = 20.0


def dev_keys(count: int) -> list[str]:
    """Return the first `count` private keys of the standard development mnemonic."""
    Account.enable_unaudited_hdwallet_features()
    return [
        Account.from_mnemonic(DEV_MNEMONIC, account_path=f"m/44'/60'/0'/0/{i}").key.to_0x_hex()
        for i in range(count)
    ]


def free_port() -> int:
    """Return a TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def rpc(url: str, method: str, params: list[Any] | None = None, timeout: float = 5.0) -> Any:
    """Call one JSON-RPC method; raise ChainError on a transport or RPC error."""
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": method, "params": params or []})
    request = urllib.request.Request(url, body.encode(), {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            reply = json.loads(response.read())
    except (urllib.error.URLError, OSError) as exc:
        raise ChainError(f"{method} at {url} failed: {exc}") from exc
    if "error" in reply:
        raise ChainError(f"{method} at {url}: {reply['error']}")
    return reply["result"]


@dataclass
class Anvil:
    """A running anvil process bound to 127.0.0.1; use as a context manager or call stop()."""

    port: int
    chain_id: int
    process: subprocess.Popen[bytes]
    keys: list[str] = field(default_factory=list)

    @property
    def url(self) -> str:
        """Return the JSON-RPC URL."""
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        """Return the process id."""
        return self.process.pid

    @classmethod
    def start(
        cls,
        *,
        port: int | None = None,
        chain_id: int = DEFAULT_CHAIN_ID,
        accounts: int = 10,
        balance_eth: int = 10_000,
        block_time: float | None = None,
        keep_history: bool = False,
    ) -> Anvil:
        """Start anvil and wait until it answers `eth_chainId`. Without `keep_history` it runs
        with `--prune-history` (no state of old blocks: less memory); reorgs
        (`anvil_reorg`) need the history kept."""
        if not ANVIL_BINARY.exists():
            raise ChainError(f"anvil is not installed at {ANVIL_BINARY}: run `make setup`")
        chosen = port or free_port()
        args = [
            str(ANVIL_BINARY),
            "--host", "127.0.0.1",
            "--port", str(chosen),
            "--chain-id", str(chain_id),
            "--accounts", str(accounts),
            "--balance", str(balance_eth),
            "--mnemonic", DEV_MNEMONIC,
            "--silent",
        ]  # fmt: skip
        if not keep_history:
            args.append("--prune-history")
        if block_time is not None:
            args += ["--block-time", str(block_time)]
        process = subprocess.Popen(
            dies_with_parent(args),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        chain = cls(port=chosen, chain_id=chain_id, process=process, keys=dev_keys(accounts))
        chain._wait_ready()
        return chain

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        delay = 0.01
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                stderr = self.process.stderr.read().decode() if self.process.stderr else ""
                raise ChainError(f"anvil exited with {self.process.returncode}: {stderr.strip()}")
            try:
                if int(rpc(self.url, "eth_chainId", timeout=1.0), 16) == self.chain_id:
                    return
            except ChainError:
                pass
            time.sleep(delay)  # readiness poll of an external process, with backoff
            delay = min(delay * 2, 0.2)
        self.stop()
        raise ChainError(f"anvil did not answer on {self.url} within {START_TIMEOUT_S}s")

    def fund(self, address: str, wei: int) -> None:
        """Set an account's ether balance."""
        rpc(self.url, "anvil_setBalance", [address, hex(wei)])

    def new_funded_key(self, wei: int = 10**21) -> str:
        """Create a fresh private key, fund it with ether and return it."""
        key = "0x" + os.urandom(32).hex()
        self.fund(address_of(key), wei)
        return key

    def latest_timestamp(self) -> int:
        """Return the latest block's timestamp."""
        return int(rpc(self.url, "eth_getBlockByNumber", ["latest", False])["timestamp"], 16)

    def increase_time(self, seconds: int) -> None:
        """Mine a block `seconds` after the latest one (works with a fixed block interval too)."""
        if seconds < 1:
            raise ValueError("time moves forward by at least one second")
        rpc(self.url, "evm_setNextBlockTimestamp", [self.latest_timestamp() + seconds])
        rpc(self.url, "evm_mine")

    def set_block_interval(self, seconds: int | None) -> None:
        """Give every new block the latest timestamp + `seconds` (None: follow the wall clock).

        With an interval the chain's clock is deterministic: a transaction sent now executes
        at exactly `latest_timestamp() + seconds`.
        """
        if seconds is None:
            rpc(self.url, "anvil_removeBlockTimestampInterval")
        else:
            rpc(self.url, "anvil_setBlockTimestampInterval", [seconds])

    def snapshot(self) -> str:
        """Take a state snapshot; return its id."""
        result: str = rpc(self.url, "evm_snapshot")
        return result

    def revert(self, snapshot_id: str) -> None:
        """Revert to a snapshot (which is consumed)."""
        if not rpc(self.url, "evm_revert", [snapshot_id]):
            raise ChainError(f"snapshot {snapshot_id} could not be reverted")

    def stop(self) -> None:
        """Stop anvil by PID (SIGTERM, then SIGKILL if it lingers)."""
        if self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                os.kill(self.process.pid, signal.SIGKILL)
                self.process.wait()
        if self.process.stderr:
            self.process.stderr.close()

    def __enter__(self) -> Anvil:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
