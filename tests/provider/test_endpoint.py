"""The daemon's advertised URL when ``public_url`` is unset: IPv6 literals in brackets."""

from __future__ import annotations

import httpx
import pytest

from provider.endpoint import daemon_url


@pytest.mark.parametrize(
    ("host", "url"),
    [
        ("127.0.0.1", "http://127.0.0.1:8080"),
        ("provider.example", "http://provider.example:8080"),
        ("::", "http://[::]:8080"),
        ("::1", "http://[::1]:8080"),
        ("2001:db8::7", "http://[2001:db8::7]:8080"),
        ("[::1]", "http://[::1]:8080"),
        ("fe80::1%eth0", "http://[fe80::1%25eth0]:8080"),
    ],
)
def test_daemon_url_when_no_public_url_then_built_from_the_bind_with_ipv6_bracketed(
    host: str, url: str
) -> None:
    assert daemon_url(host, 8080) == url
    parsed = httpx.URL(url)  # a URL a client parses back to the same host and port
    assert parsed.port == 8080 and parsed.host.replace("%25", "%") == host.strip("[]")


def test_daemon_url_when_public_url_is_set_then_it_is_taken_as_it_is() -> None:
    assert daemon_url("::", 8080, "https://tpu.example/api") == "https://tpu.example/api"
