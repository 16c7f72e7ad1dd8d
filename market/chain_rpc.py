"""The market's hot chain reads as plain JSON-RPC: the chain head and the escrow's free balance
and stake of an account, each one small request on a connection kept per thread.

The funds check and the match gate read these on the order path; through the contract binding
each read costs several times its own request (argument validation, a chain-id request, ABI
decoding). Here a read is one POST of a pre-encoded `eth_call`, decoded as one integer. An RPC
URL setting naming several endpoints (comma-separated, `contracts.rpc_endpoints`) is served in
turn: an endpoint that cannot be reached, answers a non-200 status or no JSON-RPC answer is
skipped for the next, and the one that answered is tried first next time. A JSON-RPC error
answer is an answer: it is not retried elsewhere. Any failure is `ChainUnavailableError`,
whose text names neither the endpoint nor the transport's exception text (it may reach an
HTTP answer).
"""

from __future__ import annotations

import base64
import http.client
import json
import threading
from typing import Any
from urllib.parse import SplitResult, unquote, urlsplit

from contracts.hashing import keccak256
from contracts.rpc_endpoints import endpoints
from market.errors import ChainUnavailableError

TIMEOUT_S = 10.0
"""How long one request may take before its endpoint counts as failed."""
MAX_ANSWER_BYTES = 64 << 10
"""The largest answer read: these reads answer one number; a bigger one is an endpoint's fault."""


def selector(signature: str) -> str:
    """Return the 4-byte selector of a Solidity function signature, as hex without 0x."""
    return keccak256(signature.encode())[:4].hex()


BALANCE_OF = selector("balanceOf(address)")
STAKE_OF = selector("stakeOf(address)")


def address_call(function: str, account: str) -> str:
    """Return the calldata of a one-address view call (`function`'s selector, the address)."""
    word = account.lower().removeprefix("0x")
    if len(word) != 40:
        raise ValueError(f"not an address: {account!r}")
    return "0x" + function + word.rjust(64, "0")


class RawRpc:
    """JSON-RPC requests to one chain's endpoints (see the module)."""

    def __init__(self, rpc_url: str, *, timeout_s: float = TIMEOUT_S) -> None:
        """Serve the endpoints `rpc_url` names; connect on first use."""
        self._endpoints: list[SplitResult] = [urlsplit(e) for e in endpoints(rpc_url)]
        if not self._endpoints:
            raise ValueError("the RPC URL names no endpoint")
        self._timeout_s = timeout_s
        self._local = threading.local()  # each thread's connections, by endpoint index
        self._preferred = 0  # the endpoint that answered last

    def request(self, method: str, params: list[Any]) -> Any:
        """Return the `result` of one JSON-RPC request; raise `ChainUnavailableError` if no
        endpoint answers or the answer is an error."""
        body = json.dumps(
            {"jsonrpc": "2.0", "id": 1, "method": method, "params": params},
            separators=(",", ":"),
        ).encode()
        count = len(self._endpoints)
        first = self._preferred
        for step in range(count):
            index = (first + step) % count
            try:
                reply = self._post(index, body)
            except (OSError, http.client.HTTPException, ValueError):
                continue
            self._preferred = index
            if "error" in reply or "result" not in reply:
                error = reply.get("error")
                message = error.get("message") if isinstance(error, dict) else None
                raise ChainUnavailableError(f"the chain refused {method}: {message!s:.200}")
            return reply["result"]
        raise ChainUnavailableError(
            f"the chain cannot be read now ({method}: no endpoint answered)"
        )

    def block_number(self) -> int:
        """Return the chain head's block number."""
        return _quantity(self.request("eth_blockNumber", []))

    def view(self, to: str, data: str) -> int:
        """Return the one-word answer of a view call of `to` with calldata `data`, at the head."""
        return _quantity(self.request("eth_call", [{"to": to, "data": data}, "latest"]))

    def _post(self, index: int, body: bytes) -> dict[str, Any]:
        connections: dict[int, http.client.HTTPConnection] = self._local.__dict__.setdefault(
            "connections", {}
        )
        url = self._endpoints[index]
        connection = connections.get(index)
        if connection is None:
            kind = (
                http.client.HTTPSConnection if url.scheme == "https" else http.client.HTTPConnection
            )
            connection = kind(url.hostname or "", url.port, timeout=self._timeout_s)
            connections[index] = connection
        try:
            path = url.path or "/"
            if url.query:
                path += "?" + url.query
            connection.request("POST", path, body, _headers(url))
            response = connection.getresponse()
            payload = response.read(MAX_ANSWER_BYTES + 1)
            if len(payload) > MAX_ANSWER_BYTES:
                raise ValueError("an answer too long for a number")
            if response.status != 200:
                raise http.client.HTTPException(f"status {response.status}")
            reply = json.loads(payload)
            if not isinstance(reply, dict):
                raise ValueError("not a JSON-RPC answer")
            return reply
        except BaseException:
            connections.pop(index, None)
            connection.close()
            raise


def _headers(url: SplitResult) -> dict[str, str]:
    headers = {"content-type": "application/json"}
    if url.username is not None:  # credentials in the URL: basic authentication
        pair = f"{unquote(url.username)}:{unquote(url.password or '')}".encode()
        headers["authorization"] = "Basic " + base64.b64encode(pair).decode()
    return headers


def _quantity(result: Any) -> int:
    """Decode a hex quantity or a 32-byte word; raise `ChainUnavailableError` on anything else."""
    if isinstance(result, str) and result.startswith("0x") and 2 < len(result) <= 66:
        try:
            return int(result, 16)
        except ValueError:
            pass
    raise ChainUnavailableError("the chain answered a read with something not a number")
