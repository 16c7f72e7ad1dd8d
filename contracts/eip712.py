"""EIP-712 encoding of every signed message, derived from `contracts/typed_data.json`.

The JSON file is the one definition of the signed types: the escrow's settlement messages
(`types`, `messages`) and the market's orders (`market.types`, `market.messages`). This module
reads it once and derives, for each struct, its type string (the struct, then every struct it
refers to sorted by name, as EIP-712 says), its type hash, its field order and one word encoder
per field. A message class (`Message`) names its struct with `TYPE_NAME` and declares the same
fields, in the same order, in snake_case; `check` refuses a class that differs.

Every encoder is equally strict, whoever calls it: a uint takes an `int` in range and never a
`bool`; a bool only `True` or `False`; an address only `0x` and 40 hex digits; bytes32 exactly 32
bytes; a string only a `str`; an array a tuple or list of its element type; a nested struct only
a message of that struct. Anything else raises ValueError, before anything is hashed or signed.
"""

from __future__ import annotations

import functools
import json
import operator
import re
from collections.abc import Callable
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, ClassVar, NamedTuple, Self, TypeVar

from contracts.errors import SignatureError
from contracts.hashing import keccak256
from contracts.signing import checksum_of, recover_digest, sign_digest

DEFINITION_FILE = Path(__file__).resolve().parent / "typed_data.json"
DOMAIN_TYPE = "EIP712Domain"

Encoder = Callable[[Any], bytes]
Fields = tuple[tuple[str, str], ...]


@functools.cache
def definition() -> dict[str, Any]:
    """Return the parsed `typed_data.json` (read once; treat it as read-only)."""
    data: dict[str, Any] = json.loads(DEFINITION_FILE.read_text())
    return data


@functools.cache
def struct_types() -> dict[str, Fields]:
    """Return every struct of the definition (the domain's too): name -> ((field, type), ...)."""
    data = definition()
    found: dict[str, Fields] = {}
    for section in (data["types"], data["market"]["types"]):
        for name, members in section.items():
            entry = tuple((str(m["name"]), str(m["type"])) for m in members)
            if found.setdefault(name, entry) != entry:
                raise ValueError(f"typed_data.json defines {name} twice, differently")
    return found


def fields_of(name: str) -> Fields:
    """Return the (field, type) pairs of struct `name`, in signing order."""
    return struct_types()[name]


def _referred(name: str, seen: set[str]) -> None:
    for _, kind in fields_of(name):
        base = kind.removesuffix("[]")
        if base in struct_types() and base not in seen:
            seen.add(base)
            _referred(base, seen)


@functools.cache
def referred_types(name: str) -> tuple[str, ...]:
    """Return the structs `name` refers to, directly or not, sorted by name (itself excluded)."""
    seen: set[str] = set()
    _referred(name, seen)
    seen.discard(name)
    return tuple(sorted(seen))


@functools.cache
def type_string(name: str) -> str:
    """Return the EIP-712 `encodeType` of struct `name`."""
    return "".join(
        f"{struct}({','.join(f'{kind} {field}' for field, kind in fields_of(struct))})"
        for struct in (name, *referred_types(name))
    )


@functools.cache
def type_hash(name: str) -> bytes:
    """Return keccak256 of the type string of struct `name`."""
    return keccak256(type_string(name).encode())


def typed_data_types(name: str) -> dict[str, list[dict[str, str]]]:
    """Return eth-account's typed-data `types` of a struct: it and every struct it refers to."""
    return {
        struct: [{"name": field, "type": kind} for field, kind in fields_of(struct)]
        for struct in (name, *referred_types(name))
    }


@functools.cache
def attribute(field: str) -> str:
    """Return the Python attribute of a camelCase field (`tier1FromTask` -> `tier1_from_task`)."""
    return re.sub(r"([A-Z])", r"_\1", field).lower()


# ---- word encoders ---------------------------------------------------------------------------

_ADDRESS = re.compile(r"0[xX][0-9a-fA-F]{40}")
_DECIMAL = re.compile(r"[0-9]+")
_TRUE = (1).to_bytes(32, "big")
_FALSE = bytes(32)
_PAD = bytes(12)
_STATIC = ("address", "bool", "bytes32")


def _uint_encoder(kind: str, bits: int) -> Encoder:
    bound = 1 << bits

    def uint(value: Any) -> bytes:
        if type(value) is not int and (isinstance(value, bool) or not isinstance(value, int)):
            raise ValueError(f"{value!r} does not fit {kind}")
        if not 0 <= value < bound:
            raise ValueError(f"{value!r} does not fit {kind}")
        return value.to_bytes(32, "big")  # type: ignore[no-any-return]

    return uint


def _address_word(value: Any) -> bytes:
    if not isinstance(value, str):
        raise ValueError(f"{value!r} is not an address")
    return _address_text_word(value)


@functools.lru_cache(maxsize=65_536)  # the same parties sign again and again
def _address_text_word(value: str) -> bytes:
    if _ADDRESS.fullmatch(value) is None:
        raise ValueError(f"{value!r} is not an address")
    return _PAD + bytes.fromhex(value[2:])


def _bool_word(value: Any) -> bytes:
    if value is True:
        return _TRUE
    if value is False:
        return _FALSE
    raise ValueError(f"{value!r} is not a bool")


def _bytes32_word(value: Any) -> bytes:
    if not isinstance(value, bytes) or len(value) != 32:
        raise ValueError("bytes32 field needs exactly 32 bytes")
    return bytes(value)


def _string_word(value: Any) -> bytes:
    if not isinstance(value, str):
        raise ValueError("string field needs a str")
    return _string_hash(value)


@functools.lru_cache(maxsize=4_096)
def _string_hash(value: str) -> bytes:
    return keccak256(value.encode())


def _array_encoder(element: Encoder) -> Encoder:
    def array(value: Any) -> bytes:
        if not isinstance(value, tuple | list):
            raise ValueError(f"{value!r} is not an array")
        return keccak256(b"".join([element(v) for v in value]))

    return array


def _struct_encoder(kind: str) -> Encoder:
    def struct(value: Any) -> bytes:
        if not isinstance(value, Message) or kind != value.TYPE_NAME:
            raise ValueError(f"{kind} field needs a {kind} message")
        layout = _LAYOUTS.get(type(value)) or check(type(value))
        if not layout.static:
            return struct_hash(value)
        values = layout.values(value)
        return _static_struct_hash((type(value), values, tuple(map(type, values))))

    return struct


@functools.lru_cache(maxsize=4_096)
def _static_struct_hash(key: tuple[type[Message], tuple[Any, ...], tuple[type, ...]]) -> bytes:
    """Return the struct hash of a nested struct of one-word fields (a quote's plan), cached.

    The key holds each value's type: `1`, `1.0` and `True` are equal in Python, and only the
    first is a uint, so a cached hash is never handed to a value the encoders would refuse.
    """
    cls, values, _ = key
    layout = _LAYOUTS[cls]
    encoded = b"".join([encode(v) for encode, v in zip(layout.encoders, values, strict=True)])
    return keccak256(layout.type_hash + encoded)


@functools.cache
def encoder(kind: str) -> Encoder:
    """Return the strict function that encodes a value of EIP-712 type `kind` as one word.

    Atomic types give their word; `string` and arrays their keccak256; a struct its struct hash.
    Raise TypeError for a type the definition does not use.
    """
    if kind.startswith("uint") and kind[4:].isdigit() and 8 <= int(kind[4:]) <= 256:
        return _uint_encoder(kind, int(kind[4:]))
    if kind.endswith("[]"):
        return _array_encoder(encoder(kind[:-2]))
    atomic = {
        "address": _address_word,
        "bool": _bool_word,
        "bytes32": _bytes32_word,
        "string": _string_word,
    }.get(kind)
    if atomic is not None:
        return atomic
    if kind in struct_types():
        return _struct_encoder(kind)
    raise TypeError(f"unsupported field type {kind}")


def encode_word(kind: str, value: Any) -> bytes:
    """Return `value` encoded as one EIP-712 word of type `kind` (see `encoder`)."""
    return encoder(kind)(value)


def parse_json(kind: str, value: Any) -> Any:
    """Return a field of type `kind` from its JSON form (`Message.to_json`); raise ValueError.

    uints come as integers or decimal text, bytes32 as 0x-hex, arrays as lists, structs as
    objects; the value must then encode (`encoder`), so nothing malformed gets through.
    """
    return json_parser(kind)(value)


@functools.cache
def json_parser(kind: str) -> Callable[[Any], Any]:
    """Return the function `parse_json` applies to a field of type `kind`."""
    encode = encoder(kind)
    if kind.endswith("[]"):
        element = json_parser(kind[:-2])

        def array(value: Any) -> Any:
            if not isinstance(value, list | tuple):
                raise ValueError(f"{kind} field needs a list")
            return tuple([element(v) for v in value])

        return array
    if kind in struct_types():

        def struct(value: Any) -> Any:
            if not isinstance(value, dict):
                raise ValueError(f"{kind} field needs an object")
            return message_class(kind).from_json(value)

        return struct
    if kind == "bytes32":

        def bytes32(value: Any) -> Any:
            if not isinstance(value, str):
                raise ValueError("bytes32 field needs 0x-hex text")
            raw = bytes.fromhex(value.removeprefix("0x"))
            encode(raw)
            return raw

        return bytes32
    if kind == "address":

        def address(value: Any) -> Any:
            if not isinstance(value, str):
                raise ValueError("address field needs a 0x-hex string")
            return checksum_of(value)

        return address
    number = kind.startswith("uint")

    def atomic(value: Any) -> Any:
        if number and isinstance(value, str) and _DECIMAL.fullmatch(value):
            value = int(value)
        encode(value)
        return value

    return atomic


# ---- messages --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Domain:
    """The EIP-712 domain: a signature is valid on one chain and one escrow only."""

    chain_id: int
    verifying_contract: str
    name: str = str(definition()["domain"]["name"])
    version: str = str(definition()["domain"]["version"])

    def separator(self) -> bytes:
        """Return the domain separator the contract computes."""
        return _separator(self)

    def as_dict(self) -> dict[str, Any]:
        """Return the domain in eth-account's typed-data form."""
        return {
            "name": self.name,
            "version": self.version,
            "chainId": self.chain_id,
            "verifyingContract": checksum_of(self.verifying_contract),
        }


@functools.lru_cache(maxsize=64)
def _separator(domain: Domain) -> bytes:
    words = [encode_word(k, getattr(domain, attribute(f))) for f, k in fields_of(DOMAIN_TYPE)]
    return keccak256(type_hash(DOMAIN_TYPE) + b"".join(words))


class Layout(NamedTuple):
    """What encoding a message class needs, derived once from the definition."""

    type_hash: bytes
    values: Callable[[Any], tuple[Any, ...]]  # the field values, in signing order
    encoders: tuple[Encoder, ...]  # one per field, in signing order
    attributes: tuple[str, ...]  # Python attribute of each field, in signing order
    kinds: tuple[str, ...]  # EIP-712 type of each field, in signing order
    static: bool  # every field is one word of its own value (no string, array or struct)
    parsers: tuple[tuple[str, Callable[[Any], Any]], ...]  # (attribute, JSON parser), in order


_LAYOUTS: dict[type[Message], Layout] = {}
_CLASSES: dict[str, type[Message]] = {}


def check(cls: type[Message]) -> Layout:
    """Return the layout of a message class; raise TypeError unless its dataclass fields are
    the definition's fields of its struct, in order."""
    layout = _LAYOUTS.get(cls)
    if layout is None:
        attributes = tuple(attribute(field) for field, _ in cls.TYPES)
        declared = tuple(f.name for f in fields(cls))  # type: ignore[arg-type]
        if declared != attributes:
            raise TypeError(
                f"{cls.__name__} declares {declared}; typed_data.json's {cls.TYPE_NAME} has "
                f"{attributes}"
            )
        getter = operator.attrgetter(*attributes)
        layout = _LAYOUTS[cls] = Layout(
            type_hash=type_hash(cls.TYPE_NAME),
            values=getter if len(attributes) > 1 else lambda m: (getter(m),),
            encoders=tuple(encoder(kind) for _, kind in cls.TYPES),
            attributes=attributes,
            kinds=tuple(kind for _, kind in cls.TYPES),
            static=all(kind in _STATIC or kind.startswith("uint") for _, kind in cls.TYPES)
            and not any(kind.endswith("[]") for _, kind in cls.TYPES),
            parsers=tuple(
                (name, json_parser(kind))
                for name, (_, kind) in zip(attributes, cls.TYPES, strict=True)
            ),
        )
    return layout


def message_class(type_name: str) -> type[Message]:
    """Return the message class of struct `type_name`; raise KeyError if none is defined."""
    return _CLASSES[type_name]


def struct_hash(message: Message) -> bytes:
    """Return the EIP-712 struct hash of a message."""
    layout = _LAYOUTS.get(type(message)) or check(type(message))
    values = layout.values(message)
    return keccak256(
        layout.type_hash
        + b"".join([encode(v) for encode, v in zip(layout.encoders, values, strict=True)])
    )


def digest(message: Message, domain: Domain) -> bytes:
    """Return the EIP-712 digest of a message under `domain`: what its signer signs."""
    return keccak256(b"\x19\x01" + domain.separator() + struct_hash(message))


class Message:
    """An EIP-712 struct as a frozen dataclass: subclasses set `TYPE_NAME` and the fields.

    `TYPES` (the definition's (field, type) pairs) is filled in from `typed_data.json`.
    """

    TYPE_NAME: ClassVar[str]
    TYPES: ClassVar[Fields]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "TYPE_NAME" in cls.__dict__:
            cls.TYPES = fields_of(cls.TYPE_NAME)
            _CLASSES.setdefault(cls.TYPE_NAME, cls)  # the first class of a struct is its class

    @classmethod
    def encode_type(cls) -> str:
        """Return the EIP-712 type string (referred structs appended)."""
        return type_string(cls.TYPE_NAME)

    @classmethod
    def typehash(cls) -> bytes:
        """Return keccak256 of the type string."""
        return type_hash(cls.TYPE_NAME)

    @classmethod
    def typed_data_types(cls) -> dict[str, list[dict[str, str]]]:
        """Return the `types` mapping of eth-account's typed-data form."""
        return typed_data_types(cls.TYPE_NAME)

    def struct_hash(self) -> bytes:
        """Return the EIP-712 struct hash."""
        return struct_hash(self)

    def digest(self, domain: Domain) -> bytes:
        """Return the digest a signer signs under `domain`."""
        return digest(self, domain)

    def sign(self, domain: Domain, private_key: bytes | str) -> bytes:
        """Sign under `domain`; return a 65-byte r||s||v signature (low s, v in {27, 28})."""
        return sign_digest(self.digest(domain), private_key)

    def recover(self, domain: Domain, signature: bytes) -> str:
        """Return the checksummed address that signed this message under `domain`."""
        return recover_digest(self.digest(domain), signature)

    def as_typed_data(self) -> dict[str, Any]:
        """Return the message in eth-account's typed-data form (for wallets and tests)."""
        layout = check(type(self))
        return {
            field: _typed(kind, value, nested=Message.as_typed_data)
            for (field, kind), value in zip(self.TYPES, layout.values(self), strict=True)
        }

    def as_args(self) -> tuple[Any, ...]:
        """Return the message as a tuple for a contract call."""
        layout = check(type(self))
        return tuple(
            _typed(kind, value, nested=Message.as_args)
            for kind, value in zip(layout.kinds, layout.values(self), strict=True)
        )

    def to_json(self) -> dict[str, Any]:
        """Return a JSON-ready dict (bytes as 0x-hex, uint arrays as decimal text, nested messages
        as dicts), keyed by attribute name."""
        out: dict[str, Any] = {}
        layout = check(type(self))
        for name, value in zip(layout.attributes, layout.values(self), strict=True):
            if isinstance(value, Message):
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
        for name, parse in (_LAYOUTS.get(cls) or check(cls)).parsers:
            if name not in data:
                raise ValueError(f"{cls.TYPE_NAME} lacks field {name}")
            kwargs[name] = parse(data[name])
        return cls(**kwargs)


def _typed(kind: str, value: Any, *, nested: Callable[[Any], Any]) -> Any:
    if kind == "address":
        return checksum_of(value)
    if isinstance(value, Message):
        return nested(value)
    if kind.endswith("[]"):
        return [_typed(kind[:-2], v, nested=nested) for v in value]
    return value


M = TypeVar("M", bound=Message)


def verify(message: M, domain: Domain, signature: bytes, expected: str) -> M:
    """Return `message` if `expected` signed it under `domain`; raise SignatureError otherwise."""
    signer = message.recover(domain, signature)
    if signer.lower() != expected.lower():
        raise SignatureError(f"{message.TYPE_NAME} signed by {signer}, expected {expected}")
    return message
