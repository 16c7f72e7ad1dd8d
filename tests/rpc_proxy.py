"""A JSON-RPC proxy in front of a real node, for tests that need the node to fail in a chosen
way (a stale answer, a lost reply, an outage) while everything else reaches the real node."""

from __future__ import annotations

import http.server
import threading
import urllib.request


class RpcProxy:
    """Forward every request to `upstream`, unless `intercept` answers it itself."""

    def __init__(self, upstream: str) -> None:
        """Listen on a free local port (`url`) until `close`."""
        self.upstream = upstream
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                status, data = proxy.intercept(body) or (200, proxy.forward(body))
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def intercept(self, body: bytes) -> tuple[int, bytes] | None:
        """Return the (HTTP status, body) to answer a request with, or None to forward it."""
        return None

    def forward(self, body: bytes) -> bytes:
        """Send a request body to the real node; return its answer."""
        request = urllib.request.Request(self.upstream, body, {"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=10) as reply:
            data: bytes = reply.read()
            return data

    def close(self) -> None:
        """Stop listening."""
        self.server.shutdown()
        self.server.server_close()


class FailingNode(RpcProxy):
    """Forward to the node until ``failing``, then answer every call with HTTP 503 (the node's
    provider has an outage)."""

    failing = False

    def intercept(self, body: bytes) -> tuple[int, bytes] | None:
        """Return a 503 once failing."""
        return (503, b'{"error":"upstream unavailable"}') if self.failing else None
