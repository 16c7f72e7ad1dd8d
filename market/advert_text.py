"""What a provider may advertise as text: the market stores and serves only what is safe to show.

A provider's advert reaches every visitor of the page and every client that looks a provider
up, so its free text and its URL are checked when the heartbeat arrives (a 422 naming the
field, `market.models.AdvertIn`):

- **free text** (`device_kind`): no control character (C0, C1, DEL), no invisible formatting
  character (bidirectional overrides, zero-width characters), no line or paragraph separator,
  no `<` or `>`; Unicode is put in NFC form and runs of spaces are collapsed, ends trimmed;
- **a URL** (`endpoint`): empty, or `http://` or `https://` with a host and nothing else
  risky: no spaces or control characters, no user name or password, a valid port.

The signature covers the advert as sent; what the market keeps of free text is its normalized
form. The page renders every provider-supplied string as text and links only http(s) URLs.
"""

from __future__ import annotations

import unicodedata
from urllib.parse import urlsplit

REFUSED_CATEGORIES = {
    "Cc": "a control character",
    "Cf": "an invisible formatting character",
    "Cs": "a surrogate",
    "Co": "a private-use character",
    "Cn": "an unassigned character",
    "Zl": "a line separator",
    "Zp": "a paragraph separator",
}
MARKUP = {"<": "markup ('<')", ">": "markup ('>')"}
URL_SCHEMES = ("http", "https")


class AdvertTextError(ValueError):
    """An advertised field holds what the market does not show (the message says what)."""


def _refused(char: str) -> str | None:
    """Return what is wrong with `char` in advertised text, or None."""
    if char in MARKUP:
        return MARKUP[char]
    return REFUSED_CATEGORIES.get(unicodedata.category(char))


def free_text(value: str) -> str:
    """Return `value` normalized (NFC, single spaces, trimmed), or raise `AdvertTextError`
    naming the first character refused and where it is."""
    value = unicodedata.normalize("NFC", value)
    for index, char in enumerate(value):
        what = _refused(char)
        if what is not None:
            raise AdvertTextError(f"{what} (U+{ord(char):04X}) at position {index}")
    normalized = " ".join(part for part in value.split(" ") if part)
    if not normalized:
        raise AdvertTextError("nothing but spaces")
    return normalized


def http_url(value: str) -> str:
    """Return `value` if it is empty or an http(s) URL with a host and no credentials; raise
    `AdvertTextError` saying why not otherwise."""
    if value == "":
        return value
    for index, char in enumerate(value):
        if char.isspace() or _refused(char) is not None:
            raise AdvertTextError(f"U+{ord(char):04X} at position {index}: not in a URL")
    try:
        parts = urlsplit(value)
        port = parts.port
    except ValueError as exc:
        raise AdvertTextError(f"not a URL: {exc}") from None
    if parts.scheme.lower() not in URL_SCHEMES:
        shown = parts.scheme[:20] or "none"
        raise AdvertTextError(f"scheme {shown!r}: only http and https URLs are advertised")
    if not parts.hostname:
        raise AdvertTextError("no host")
    if parts.username is not None or parts.password is not None:
        raise AdvertTextError("a user name or password in the URL")
    if port == 0:
        raise AdvertTextError("port 0")
    return value


def shown_text(value: str) -> str:
    """Return stored free text as the rules would keep it, each refused character replaced
    by U+FFFD (a row stored before the rules)."""
    try:
        return free_text(value)
    except AdvertTextError:
        kept = "".join("\ufffd" if _refused(c) is not None else c for c in value)
        return " ".join(part for part in kept.split(" ") if part)


def shown_url(value: str) -> str:
    """Return a stored URL if the rules allow it, else "" (a row stored before the rules)."""
    try:
        return http_url(value)
    except AdvertTextError:
        return ""
