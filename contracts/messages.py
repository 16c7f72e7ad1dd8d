"""Frozen EIP-712 message types the escrow verifies, with digest, sign and recover helpers.

One definition per message, mirrored field for field by `contracts/sol/types/Messages.sol`.
Digests are computed here directly (no typed-data builder on the hot path) and are tested to
equal both the contract's digest views and eth-account's typed-data encoder.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any, ClassVar, NamedTuple, Self, TypeVar

import coincurve
from eth_utils.address import to_canonical_address, to_checksum_address

from contracts.errors import SignatureError
from contracts.hashing import keccak256, keccak_text

KIND_COMPILE = 0
KIND_INFERENCE = 1
STATUS_SUCCESS = 0
DOMAIN_NAME = "ComputeEscrow"
DOMAIN_VERSION = "2"
SECP256K1_N = 0xFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFEBAAEDCE6AF48A03BBFD25E8CD0364141
ZERO_ADDRESS = "0x" + "00" * 20
ZERO_HASH = b"\x00" * 32

_DOMAIN_TYPEHASH = keccak_text(
    "EIP712Domain(string name,string version,uint256 chainId,address verifyingContract)"
)


@dataclass(frozen=True)
class Domain:
    """The EIP-712 domain: a signature is valid on one chain and one escrow only."""

    chain_id: int
    verifying_contract: str
    name: str = DOMAIN_NAME
    version: str = DOMAIN_VERSION

    def separator(self) -> bytes:
        """Return the domain separator the contract computes."""
        return _separator(self)

    def _compute_separator(self) -> bytes:
        return keccak256(
            _DOMAIN_TYPEHASH
            + keccak_text(self.name)
            + keccak_text(self.version)
            + _word("uint256", self.chain_id)
            + _word("address", self.verifying_contract)
        )

    def as_dict(self) -> dict[str, Any]:
        """Return the domain in eth-account's typed-data form."""
        return {
            "name": self.name,
            "version": self.version,
            "chainId": self.chain_id,
            "verifyingContract": to_checksum_address(self.verifying_contract),
        }


@functools.lru_cache(maxsize=64)
def _separator(domain: Domain) -> bytes:
    return domain._compute_separator()


def _word(kind: str, value: Any) -> bytes:
    return _encoder(kind)(value)


@functools.cache
def _encoder(kind: str) -> Callable[[Any], bytes]:
    """Return the function that encodes a value of an atomic EIP-712 type as one 32-byte word."""
    if kind.startswith("uint") and kind[4:].isdigit():
        bound = 1 << int(kind[4:])

        def uint(value: Any) -> bytes:
            if not 0 <= value < bound:
                raise ValueError(f"{value} does not fit {kind}")
            return int(value).to_bytes(32, "big")

        return uint
    if kind == "address":
        return _address_word
    if kind == "bool":
        return _bool_word
    if kind == "bytes32":
        return _bytes32_word
    return functools.partial(_unsupported, kind)


@functools.lru_cache(maxsize=4096)
def _address_word(value: str | bytes) -> bytes:
    return to_canonical_address(value).rjust(32, b"\x00")


def _bool_word(value: Any) -> bytes:
    return (1 if value else 0).to_bytes(32, "big")


def _bytes32_word(value: Any) -> bytes:
    if not isinstance(value, bytes) or len(value) != 32:
        raise ValueError("bytes32 field needs exactly 32 bytes")
    return value


def _unsupported(kind: str, value: Any) -> bytes:
    raise TypeError(f"unsupported field type {kind}")


class _Message:
    """Shared EIP-712 machinery: subclasses are frozen dataclasses with a `TYPES` list."""

    TYPE_NAME: ClassVar[str]
    TYPES: ClassVar[tuple[tuple[str, str], ...]]

    @classmethod
    def encode_type(cls) -> str:
        """Return the EIP-712 type string (nested types appended)."""
        own = f"{cls.TYPE_NAME}({','.join(f'{t} {n}' for n, t in cls.TYPES)})"
        return own + "".join(nested.encode_type() for nested in cls._nested())

    @classmethod
    def _nested(cls) -> list[type[_Message]]:
        return []

    @classmethod
    def typehash(cls) -> bytes:
        """Return keccak256 of the type string (computed once per type)."""
        return _layout(cls).typehash

    def _encode_field(self, kind: str, value: Any) -> bytes:
        return _word(kind, value)

    def struct_hash(self) -> bytes:
        """Return the EIP-712 struct hash."""
        cls = type(self)
        if cls._encode_field is _Message._encode_field:  # atomic fields only: the fast path
            encoders = _layout(cls).encoders
            encoded = b"".join([encode(getattr(self, name)) for name, encode in encoders])
        else:
            encoded = b"".join(
                self._encode_field(t, getattr(self, _attr(n))) for n, t in self.TYPES
            )
        return keccak256(self.typehash() + encoded)

    def digest(self, domain: Domain) -> bytes:
        """Return the digest a signer signs under `domain`."""
        return keccak256(b"\x19\x01" + domain.separator() + self.struct_hash())

    def sign(self, domain: Domain, private_key: bytes | str) -> bytes:
        """Sign under `domain`; return a 65-byte r||s||v signature (low s, v in {27, 28})."""
        return sign_digest(self.digest(domain), private_key)

    def recover(self, domain: Domain, signature: bytes) -> str:
        """Return the checksummed address that signed this message under `domain`."""
        return recover_digest(self.digest(domain), signature)

    def as_typed_data(self) -> dict[str, Any]:
        """Return the message in eth-account's typed-data form (for wallets and tests)."""
        return {n: self._typed_value(t, getattr(self, _attr(n))) for n, t in self.TYPES}

    @classmethod
    def typed_data_types(cls) -> dict[str, list[dict[str, str]]]:
        """Return the `types` mapping of eth-account's typed-data form."""
        types = {cls.TYPE_NAME: [{"name": n, "type": t} for n, t in cls.TYPES]}
        for nested in cls._nested():
            types.update(nested.typed_data_types())
        return types

    def _typed_value(self, kind: str, value: Any) -> Any:
        if isinstance(value, _Message):
            return value.as_typed_data()
        if kind == "address":
            return checksum_of(value)
        return value

    def as_args(self) -> tuple[Any, ...]:
        """Return the message as a tuple for a contract call."""
        return tuple(
            self._typed_value(t, v)
            if t == "address"
            else v.as_args()
            if isinstance(v, _Message)
            else v
            for t, v in ((t, getattr(self, _attr(n))) for n, t in self.TYPES)
        )

    def to_json(self) -> dict[str, Any]:
        """Return a JSON-ready dict (bytes as 0x-hex, nested messages as dicts)."""
        out: dict[str, Any] = {}
        for name in _layout(type(self)).names:
            value = getattr(self, name)
            if isinstance(value, _Message):
                out[name] = value.to_json()
            elif isinstance(value, bytes):
                out[name] = "0x" + value.hex()
            elif isinstance(value, tuple):
                out[name] = [str(v) for v in value]
            else:
                out[name] = value
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Self:
        """Build the message from `to_json` output; raise ValueError on bad fields."""
        kwargs: dict[str, Any] = {}
        layout = _layout(cls)
        kinds = layout.kinds
        for name in layout.names:
            if name not in data:
                raise ValueError(f"{cls.TYPE_NAME} lacks field {name}")
            kwargs[name] = _from_json(kinds[name], data[name], cls)
        return cls(**kwargs)


def _from_json(kind: str, value: Any, owner: type[_Message]) -> Any:
    if kind == "bytes32":
        raw = bytes.fromhex(str(value).removeprefix("0x"))
        if len(raw) != 32:
            raise ValueError("bytes32 field needs 32 bytes")
        return raw
    if kind == "uint256[]":
        return tuple(int(v) for v in value)
    if kind == "bool":
        if not isinstance(value, bool):
            raise ValueError("bool field needs true or false")
        return value
    if kind == "address":
        if not isinstance(value, str):
            raise ValueError("address field needs a 0x-hex string")
        return checksum_of(value)
    if kind.startswith("uint"):
        number = int(value)
        _word(kind, number)
        return number
    nested = {m.TYPE_NAME: m for m in owner._nested()}[kind]
    return nested.from_json(value)


class _Layout(NamedTuple):
    """What encoding a message type needs, computed once per type."""

    typehash: bytes
    encoders: tuple[tuple[str, Callable[[Any], bytes]], ...]  # (attribute, encoder), EIP-712 order
    names: tuple[str, ...]  # dataclass field names, declaration order
    kinds: dict[str, str]  # EIP-712 type of each field, by attribute name


_LAYOUTS: dict[type[_Message], _Layout] = {}


def _layout(cls: type[_Message]) -> _Layout:
    """Return the encoding layout of a message type."""
    found = _LAYOUTS.get(cls)
    if found is None:
        found = _LAYOUTS[cls] = _Layout(
            typehash=_typehash(cls.encode_type()),
            encoders=tuple((_attr(name), _encoder(kind)) for name, kind in cls.TYPES),
            names=tuple(f.name for f in fields(cls)),  # type: ignore[arg-type]
            kinds={_attr(name): kind for name, kind in cls.TYPES},
        )
    return found


@functools.cache
def _typehash(encoded_type: str) -> bytes:
    return keccak_text(encoded_type)


@functools.cache
def _attr(name: str) -> str:
    """Map a camelCase EIP-712 field name to the dataclass attribute name."""
    out = []
    for ch in name:
        if ch.isupper():
            out.append("_" + ch.lower())
        else:
            out.append(ch)
    return "".join(out).replace("tier_1", "tier1").replace("tier_2", "tier2")


@dataclass(frozen=True)
class Plan(_Message):
    """How a deal prices each task (see `contracts.pricing`)."""

    TYPE_NAME: ClassVar[str] = "Plan"
    TYPES: ClassVar[tuple[tuple[str, str], ...]] = (
        ("pricePerDeviceMs", "uint64"),
        ("compilePrice", "uint64"),
        ("inferencePrice", "uint64"),
        ("reservationFee", "uint64"),
        ("reservedDiscountBps", "uint16"),
        ("cacheHitDiscountBps", "uint16"),
        ("tier1FromTask", "uint32"),
        ("tier1DiscountBps", "uint16"),
        ("tier2FromTask", "uint32"),
        ("tier2DiscountBps", "uint16"),
        ("outcomeBased", "bool"),
    )

    price_per_device_ms: int = 0
    compile_price: int = 0
    inference_price: int = 0
    reservation_fee: int = 0
    reserved_discount_bps: int = 0
    cache_hit_discount_bps: int = 0
    tier1_from_task: int = 0
    tier1_discount_bps: int = 0
    tier2_from_task: int = 0
    tier2_discount_bps: int = 0
    outcome_based: bool = False


@dataclass(frozen=True)
class Quote(_Message):
    """Terms a provider signs; a client opens a deal with it."""

    TYPE_NAME: ClassVar[str] = "Quote"
    TYPES: ClassVar[tuple[tuple[str, str], ...]] = (
        ("provider", "address"),
        ("client", "address"),
        ("arbiter", "address"),
        ("maxSpend", "uint256"),
        ("stake", "uint256"),
        ("penalty", "uint256"),
        ("duration", "uint64"),
        ("challengeWindow", "uint64"),
        ("sloMs", "uint64"),
        ("validUntil", "uint64"),
        ("nonce", "uint256"),
        ("plan", "Plan"),
    )

    provider: str
    client: str
    arbiter: str
    max_spend: int
    stake: int
    penalty: int
    duration: int
    challenge_window: int
    slo_ms: int
    valid_until: int
    nonce: int
    plan: Plan

    @classmethod
    def _nested(cls) -> list[type[_Message]]:
        return [Plan]

    def _encode_field(self, kind: str, value: Any) -> bytes:
        if kind == "Plan":
            return bytes(value.struct_hash())
        return _word(kind, value)


@dataclass(frozen=True)
class TaskRequest(_Message):
    """A client's signed request to run one task of a deal."""

    TYPE_NAME: ClassVar[str] = "TaskRequest"
    TYPES: ClassVar[tuple[tuple[str, str], ...]] = (
        ("dealId", "uint256"),
        ("taskIndex", "uint32"),
        ("kind", "uint8"),
        ("programHash", "bytes32"),
        ("inputHash", "bytes32"),
        ("maxPrice", "uint256"),
        ("deadline", "uint64"),
    )

    deal_id: int
    task_index: int
    kind: int
    program_hash: bytes
    input_hash: bytes
    max_price: int
    deadline: int  # unix seconds by which the result must be delivered; the client sets it


@dataclass(frozen=True)
class Ack(_Message):
    """A provider's signed acceptance of a task request: its deadline, at this price.

    `request_hash` is the request's EIP-712 struct hash; the deadline it commits to is the
    request's own (`TaskRequest.deadline`), which the client signed.
    """

    TYPE_NAME: ClassVar[str] = "Ack"
    TYPES: ClassVar[tuple[tuple[str, str], ...]] = (
        ("dealId", "uint256"),
        ("taskIndex", "uint32"),
        ("requestHash", "bytes32"),
        ("price", "uint256"),
    )

    deal_id: int
    task_index: int
    request_hash: bytes
    price: int


@dataclass(frozen=True)
class Receipt(_Message):
    """A provider's signed account of one executed task."""

    TYPE_NAME: ClassVar[str] = "Receipt"
    TYPES: ClassVar[tuple[tuple[str, str], ...]] = (
        ("dealId", "uint256"),
        ("taskIndex", "uint32"),
        ("kind", "uint8"),
        ("status", "uint8"),
        ("cacheHit", "bool"),
        ("deviceMs", "uint64"),
        ("compileMs", "uint64"),
        ("programHash", "bytes32"),
        ("inputHash", "bytes32"),
        ("outputHash", "bytes32"),
        ("startedAt", "uint64"),
        ("finishedAt", "uint64"),
        ("deadline", "uint64"),
        ("amount", "uint256"),
        ("prevReceiptHash", "bytes32"),
    )

    deal_id: int
    task_index: int
    kind: int
    status: int
    cache_hit: bool
    device_ms: int
    compile_ms: int
    program_hash: bytes
    input_hash: bytes
    output_hash: bytes
    started_at: int
    finished_at: int
    deadline: int  # the request's deadline
    amount: int
    prev_receipt_hash: bytes

    def request(self, max_price: int) -> TaskRequest:
        """Return the task request this receipt answers, given the request's `max_price`."""
        return TaskRequest(
            deal_id=self.deal_id,
            task_index=self.task_index,
            kind=self.kind,
            program_hash=self.program_hash,
            input_hash=self.input_hash,
            max_price=max_price,
            deadline=self.deadline,
        )


@dataclass(frozen=True)
class Voucher(_Message):
    """A client's signed cumulative promise to pay: total owed and the tasks it covers."""

    TYPE_NAME: ClassVar[str] = "Voucher"
    TYPES: ClassVar[tuple[tuple[str, str], ...]] = (
        ("dealId", "uint256"),
        ("cumulativeAmount", "uint256"),
        ("tasks", "uint256[]"),
    )

    deal_id: int
    cumulative_amount: int
    tasks: tuple[int, ...]

    def _encode_field(self, kind: str, value: Any) -> bytes:
        if kind == "uint256[]":
            return keccak256(b"".join(_word("uint256", v) for v in value))
        return _word(kind, value)

    def _typed_value(self, kind: str, value: Any) -> Any:
        return list(value) if kind == "uint256[]" else super()._typed_value(kind, value)

    def as_args(self) -> tuple[Any, ...]:
        """Return the voucher as a tuple for a contract call."""
        return (self.deal_id, self.cumulative_amount, list(self.tasks))

    def covers(self, task_index: int) -> bool:
        """Return whether the voucher pays task `task_index`."""
        word, bit = divmod(task_index, 256)
        return word < len(self.tasks) and bool(self.tasks[word] >> bit & 1)


@dataclass(frozen=True)
class Claim:
    """One task a provider claims on chain: its receipt and the client's signed request.

    The request is rebuilt from the receipt's fields and `max_price`, so the client's
    signature binds the task, its hashes, its deadline and the most it pays.
    """

    receipt: Receipt
    max_price: int
    request_signature: bytes

    def as_args(self) -> tuple[Any, ...]:
        """Return the claim as a tuple for a contract call."""
        return (self.receipt.as_args(), self.max_price, self.request_signature)


def task_bitmap(task_indices: Any) -> tuple[int, ...]:
    """Return the voucher bitmap words that mark every index in `task_indices`."""
    indices = sorted(set(task_indices))
    if not indices:
        return ()
    words = [0] * (indices[-1] // 256 + 1)
    for index in indices:
        if index < 0:
            raise ValueError("task indices are non-negative")
        words[index // 256] |= 1 << (index % 256)
    return tuple(words)


M = TypeVar("M", bound=_Message)


def _private_key(private_key: bytes | str) -> coincurve.PrivateKey:
    raw = (
        bytes.fromhex(private_key.removeprefix("0x"))
        if isinstance(private_key, str)
        else private_key
    )
    return coincurve.PrivateKey(raw)


def sign_digest(digest: bytes, private_key: bytes | str) -> bytes:
    """Sign a 32-byte digest; return r||s||v with low s and v in {27, 28}."""
    raw = _private_key(private_key).sign_recoverable(digest, hasher=None)
    return raw[:64] + bytes([raw[64] + 27])


def recover_digest(digest: bytes, signature: bytes) -> str:
    """Return the signer of `digest`; raise SignatureError on malformed or malleable signatures."""
    return checksum_of(keccak256(recover_public(digest, signature)[1:])[-20:])


@functools.lru_cache(maxsize=65_536)
def checksum_of(address: bytes | str) -> str:
    """Return the EIP-55 form of an address, 20 bytes or text; raise ValueError if it is none.

    Cached: the same parties sign again and again, and the checksum costs about as much as a
    signature recovery (~30 us).
    """
    return to_checksum_address(address)


def recover_public(digest: bytes, signature: bytes) -> bytes:
    """Return the uncompressed public key that signed `digest` (65 bytes, 0x04 first).

    Raise SignatureError unless the signature is 65 bytes, v is 27 or 28 and s is in the
    lower half order (no malleable twins).
    """
    if len(signature) != 65:
        raise SignatureError(f"signature must be 65 bytes, got {len(signature)}")
    v = signature[64]
    s = int.from_bytes(signature[32:64], "big")
    if v not in (27, 28):
        raise SignatureError(f"signature v must be 27 or 28, got {v}")
    if not 0 < s <= SECP256K1_N // 2:
        raise SignatureError("signature s is not in the lower half order (malleable)")
    try:
        public = coincurve.PublicKey.from_signature_and_message(
            signature[:64] + bytes([v - 27]), digest, hasher=None
        )
    except Exception as exc:  # coincurve raises plain Exception on bad points
        raise SignatureError(f"signature does not recover: {exc}") from exc
    return bytes(public.format(compressed=False))


def address_of(private_key: bytes | str) -> str:
    """Return the checksummed address of a private key."""
    public = _private_key(private_key).public_key.format(compressed=False)
    return checksum_of(keccak256(public[1:])[-20:])


def verify(message: M, domain: Domain, signature: bytes, expected: str) -> M:
    """Return `message` if `expected` signed it under `domain`; raise SignatureError otherwise."""
    signer = message.recover(domain, signature)
    if signer.lower() != expected.lower():
        raise SignatureError(f"{message.TYPE_NAME} signed by {signer}, expected {expected}")
    return message
