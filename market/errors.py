"""Typed errors of the market; every one derives from `MarketError`.

Each error mixes in the builtin it refines (`ValueError`, `LookupError`), so callers that only
know the builtins still catch it, and carries the offending values as attributes so the API
layer can map it to a 4xx with a reason without parsing the message.
"""

from __future__ import annotations


class MarketError(Exception):
    """Root of every error the market raises on purpose."""


class InvalidOrderError(MarketError, ValueError):
    """Raise when an order's fields break a rule (empty id, negative memory, bad side, ...)."""

    def __init__(self, field: str, value: object, reason: str) -> None:
        self.field = field
        self.value = value
        self.reason = reason
        super().__init__(f"invalid order {field}={value!r}: {reason}")


class InvalidQuantityError(InvalidOrderError):
    """Raise when an order's quantity is not a positive integer."""

    def __init__(self, value: object) -> None:
        super().__init__("quantity", value, "must be a positive integer")


class InvalidPriceError(InvalidOrderError):
    """Raise when an order's limit price is not a positive integer."""

    def __init__(self, value: object) -> None:
        super().__init__("price", value, "must be a positive integer")


class OrderExpiredError(InvalidOrderError):
    """Raise when an order is placed at or after its own expiry."""

    def __init__(self, order_id: str, expiry: int, now: int) -> None:
        self.order_id = order_id
        self.expiry = expiry
        self.now = now
        super().__init__("expiry", expiry, f"order {order_id!r} expired (now={now})")


class DuplicateOrderError(MarketError, ValueError):
    """Raise when an order id has already been placed."""

    def __init__(self, order_id: str) -> None:
        self.order_id = order_id
        super().__init__(f"order {order_id!r} already exists")


class UnknownOrderError(MarketError, LookupError):
    """Raise when an order id is not known to the engine."""

    def __init__(self, order_id: str) -> None:
        self.order_id = order_id
        super().__init__(f"unknown order {order_id!r}")


class OrderStateError(MarketError, ValueError):
    """Raise when an order cannot move to the requested lifecycle state (e.g. cancel a fill)."""

    def __init__(self, order_id: str, state: str, target: str) -> None:
        self.order_id = order_id
        self.state = state
        self.target = target
        super().__init__(f"order {order_id!r} cannot go from {state} to {target}")


class SnapshotError(MarketError, ValueError):
    """Raise when snapshot data cannot be restored (malformed, inconsistent, wrong version)."""


class AuthError(MarketError, PermissionError):
    """Raise when a signature is malformed or not by the party it claims."""


class ForbiddenError(MarketError, PermissionError):
    """Raise when a correctly signed request acts on something the signer does not own."""


class SignatureExpiredError(AuthError):
    """Raise when a signed request is past its expiry or outside the allowed clock skew."""


class ReplayError(MarketError, ValueError):
    """Raise when a nonce (or heartbeat timestamp) was used before."""


class RateLimitedError(MarketError):
    """Raise when a signer or an IP address exceeds its rate."""

    def __init__(self, key: str, retry_after: float) -> None:
        self.key = key
        self.retry_after = retry_after
        super().__init__(f"rate limit exceeded for {key}; retry after {retry_after:.2f}s")


class NotFoundError(MarketError, LookupError):
    """Raise when a requested record does not exist."""


class InvalidRequestError(MarketError, ValueError):
    """Raise when a request is well-formed but breaks a market rule."""


class PayloadTooLargeError(MarketError):
    """Raise when a request carries more than the market accepts at once."""


class ChainUnavailableError(MarketError):
    """Raise when an answer needs the chain (the escrow's minimum window, a nonce) but it is
    down."""


class ChallengeWindowTooShortError(InvalidOrderError):
    """Raise when a quote's challenge window is zero or below the escrow's minimum."""

    def __init__(self, window: int, minimum: int) -> None:
        self.window = window
        self.minimum = minimum
        super().__init__(
            "quote.challenge_window", window, f"below the minimum challenge window of {minimum}s"
        )


class UnsupportedMediaTypeError(MarketError, ValueError):
    """Raise when a request body is not declared as JSON."""


class UnfundedError(ForbiddenError):
    """Raise when an order or an advert has no funds behind it on the escrow: a bid whose
    signer's free balance does not cover it, an ask or a heartbeat from an address without
    stake, an order in a device class no staked provider advertises."""


class QuotaError(ForbiddenError):
    """Raise when a signer holds as many live orders (or device classes) as the market allows."""


class WrongClassError(MarketError, LookupError):
    """Raise when an order, cancel or heartbeat names a device class another market process
    matches (`market.partition`); the message names the classes this one serves."""


class MarketConfigError(MarketError, ValueError):
    """A market setting is invalid (from the environment or the command line); the message
    names the setting, its environment variable and the value given."""
