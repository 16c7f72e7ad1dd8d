"""The daemon's own base URL: the configured ``public_url``, else one built from its bind."""

from __future__ import annotations


def host_in_url(host: str) -> str:
    """Return ``host`` as a URL's authority writes it: an IPv6 literal in brackets (its zone,
    if any, with ``%`` escaped as ``%25``); a name or IPv4 address as it is."""
    if ":" not in host or host.startswith("["):
        return host
    address, percent, zone = host.partition("%")
    return f"[{address}{'%25' + zone if percent else ''}]"


def daemon_url(host: str, port: int, public_url: str | None = None) -> str:
    """Return ``public_url`` when set, else ``http://<host>:<port>`` with IPv6 bracketed."""
    return public_url or f"http://{host_in_url(host)}:{port}"
