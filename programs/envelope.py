"""Task program envelope shared by client and provider.

A task's program is a serialized ``jax.export.Exported`` blob (a flatbuffer holding StableHLO
bytecode), never pickle and never Python. Its arguments travel as safetensors or ``.npz``
(loaded with ``allow_pickle=False``). This module is pure: it imports numpy and safetensors
but not JAX, so the market and the provider's parent process can handle envelopes without it.

Wire format (all integers big-endian)::

    b"TPMP" | u8 format version | u32 header length | header (UTF-8 JSON) | sections

The JSON header names the producer versions, target platforms, array format, the hex sha256
of each section and each section's length; the sections follow in the order
``program, inputs, weights``. Every length is checked against caps before anything is sliced.

Arguments are matched to the exported function's flat argument list by name: tensor ``"3"``
is flat argument 3 (in ``jax.tree_util`` leaf order of the exported ``in_tree``). A name may
appear in the weights or in the inputs, not both. Outputs are named the same way.
"""

from __future__ import annotations

import hashlib
import io
import json
import struct
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Final

import numpy as np
import numpy.typing as npt
import safetensors.numpy

MAGIC: Final = b"TPMP"
FORMAT_VERSION: Final = 1
MAX_PROGRAM_BYTES: Final = 64 * 1024 * 1024
MAX_ARRAYS_BYTES: Final = 1024 * 1024 * 1024
MAX_HEADER_BYTES: Final = 64 * 1024
MAX_ENVELOPE_BYTES: Final = MAX_PROGRAM_BYTES + 2 * MAX_ARRAYS_BYTES + MAX_HEADER_BYTES + 9
MAX_TENSORS: Final = 4096
KNOWN_PLATFORMS: Final = frozenset({"cpu", "cuda", "rocm", "tpu"})
_PREFIX = struct.Struct(">4sBI")
_HASH_DOMAIN_INPUTS_WITH_WEIGHTS: Final = b"tpumarket.inputs+weights.v1"

Array = npt.NDArray[np.generic]


class ProgramError(Exception):
    """The package's exception root: everything in ``programs`` that refuses input raises it."""


class ProgramFormatError(ProgramError, ValueError):
    """Raised when an envelope or an array file is malformed, oversized or inconsistent."""


class ArrayFormat(StrEnum):
    """How the inputs and weights of a program are serialized."""

    SAFETENSORS = "safetensors"
    NPZ = "npz"


def program_hash(blob: bytes) -> bytes:
    """Return the 32-byte sha256 of a serialized ``Exported`` blob (an EIP-712 bytes32)."""
    return hashlib.sha256(blob).digest()


def inputs_hash(data: bytes, weights: bytes | None = None) -> bytes:
    """Return the 32-byte hash committing to a task's inputs and, when present, its weights.

    Without weights this is ``sha256(inputs)``; with weights it is
    ``sha256(domain || sha256(weights) || sha256(inputs))`` so neither part can be swapped.
    """
    return _inputs_hash(data, None if weights is None else hashlib.sha256(weights).digest())


def _inputs_hash(data: bytes, weights_sha256: bytes | None) -> bytes:
    """`inputs_hash` from the weights' sha256 (hashed once per envelope: weights are large)."""
    if weights_sha256 is None:
        return hashlib.sha256(data).digest()
    return hashlib.sha256(
        _HASH_DOMAIN_INPUTS_WITH_WEIGHTS + weights_sha256 + hashlib.sha256(data).digest()
    ).digest()


def outputs_hash(data: bytes) -> bytes:
    """Return the 32-byte sha256 of a task's outputs exactly as delivered (safetensors bytes)."""
    return hashlib.sha256(data).digest()


def encode_arrays(arrays: Mapping[str, Array], fmt: ArrayFormat = ArrayFormat.SAFETENSORS) -> bytes:
    """Serialize named arrays as safetensors (default) or an uncompressed ``.npz``."""
    contiguous = {
        name: np.ascontiguousarray(value).reshape(np.shape(value)) for name, value in arrays.items()
    }
    if fmt is ArrayFormat.SAFETENSORS:
        return safetensors.numpy.save(contiguous)
    buffer = io.BytesIO()
    np.savez(buffer, allow_pickle=False, **contiguous)  # type: ignore[arg-type]
    return buffer.getvalue()


def decode_arrays(
    data: bytes, fmt: ArrayFormat, *, max_bytes: int = MAX_ARRAYS_BYTES
) -> dict[str, Array]:
    """Load named arrays from safetensors or ``.npz`` bytes; never unpickles anything."""
    if len(data) > max_bytes:
        raise ProgramFormatError(f"array file of {len(data)} bytes exceeds the cap {max_bytes}")
    try:
        if fmt is ArrayFormat.SAFETENSORS:
            loaded: dict[str, Array] = dict(safetensors.numpy.load(data))
        else:
            loaded = _load_npz(data, max_bytes)
    except ProgramFormatError:
        raise
    except Exception as exc:  # any parser failure on untrusted bytes is a format error
        raise ProgramFormatError(f"cannot read {fmt.value} arrays: {exc}") from exc
    if len(loaded) > MAX_TENSORS:
        raise ProgramFormatError(f"{len(loaded)} tensors exceed the cap {MAX_TENSORS}")
    return loaded


def _load_npz(data: bytes, max_bytes: int) -> dict[str, Array]:
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        total = sum(info.file_size for info in archive.infolist())
        if total > max_bytes:  # a zip bomb declares its inflated size here
            raise ProgramFormatError(f"npz inflates to {total} bytes, over the cap {max_bytes}")
    with np.load(io.BytesIO(data), allow_pickle=False) as npz:
        return {name: np.asarray(npz[name]) for name in npz.files}


@dataclass(frozen=True, slots=True)
class ProducerVersions:
    """Versions of the software that exported the program."""

    jax: str
    jaxlib: str
    calling_convention: int


@dataclass(frozen=True, slots=True)
class ProgramEnvelope:
    """A task program and its arguments, with the hashes that signed messages refer to.

    Build one with :meth:`create`, which computes the hashes; :func:`decode_envelope` checks
    that the stated hashes match the bytes.
    """

    program: bytes
    inputs: bytes
    program_sha256: bytes
    inputs_sha256: bytes
    producer: ProducerVersions
    platforms: tuple[str, ...]
    array_format: ArrayFormat = ArrayFormat.SAFETENSORS
    weights: bytes | None = field(default=None)
    weights_sha256: bytes | None = field(default=None, compare=False, repr=False)
    """The sha256 of ``weights``, set by :meth:`check` (which every constructor here runs), so
    the daemon and its sandbox hash a task's weights once."""

    @classmethod
    def create(
        cls,
        *,
        program: bytes,
        inputs: bytes,
        producer: ProducerVersions,
        platforms: tuple[str, ...],
        array_format: ArrayFormat = ArrayFormat.SAFETENSORS,
        weights: bytes | None = None,
    ) -> ProgramEnvelope:
        """Build an envelope, computing its program and inputs hashes."""
        envelope = cls(
            program=bytes(program),
            inputs=bytes(inputs),
            program_sha256=program_hash(program),
            inputs_sha256=inputs_hash(inputs, weights),
            producer=producer,
            platforms=tuple(platforms),
            array_format=array_format,
            weights=None if weights is None else bytes(weights),
        )
        envelope.check()
        return envelope

    def check(self) -> None:
        """Raise :class:`ProgramFormatError` unless sizes, hashes and fields are consistent."""
        if not self.program:
            raise ProgramFormatError("empty program")
        if len(self.program) > MAX_PROGRAM_BYTES:
            raise ProgramFormatError(
                f"program of {len(self.program)} bytes exceeds the cap {MAX_PROGRAM_BYTES}"
            )
        for name, part in (("inputs", self.inputs), ("weights", self.weights or b"")):
            if len(part) > MAX_ARRAYS_BYTES:
                raise ProgramFormatError(
                    f"{name} of {len(part)} bytes exceed the cap {MAX_ARRAYS_BYTES}"
                )
        if self.program_sha256 != program_hash(self.program):
            raise ProgramFormatError("program_sha256 does not match the program bytes")
        weights_sha256 = None if self.weights is None else hashlib.sha256(self.weights).digest()
        if self.inputs_sha256 != _inputs_hash(self.inputs, weights_sha256):
            raise ProgramFormatError("inputs_sha256 does not match the inputs and weights")
        object.__setattr__(self, "weights_sha256", weights_sha256)  # a cache of a checked value
        if not self.platforms or any(p not in KNOWN_PLATFORMS for p in self.platforms):
            raise ProgramFormatError(f"unknown or empty platforms {self.platforms!r}")
        if self.producer.calling_convention < 0:
            raise ProgramFormatError("negative calling convention version")

    def arguments(self) -> dict[str, Array]:
        """Return weights and inputs merged by name; a name given twice is an error."""
        merged = decode_arrays(self.inputs, self.array_format) if self.inputs else {}
        if self.weights is not None:
            weights = decode_arrays(self.weights, self.array_format)
            clash = sorted(set(weights) & set(merged))
            if clash:
                raise ProgramFormatError(f"tensors named in both weights and inputs: {clash}")
            merged.update(weights)
        return merged


def encode_envelope(envelope: ProgramEnvelope) -> bytes:
    """Serialize an envelope to its compact binary wire form."""
    envelope.check()
    weights = envelope.weights or b""
    header = {
        "program_sha256": envelope.program_sha256.hex(),
        "inputs_sha256": envelope.inputs_sha256.hex(),
        "jax": envelope.producer.jax,
        "jaxlib": envelope.producer.jaxlib,
        "calling_convention": envelope.producer.calling_convention,
        "platforms": list(envelope.platforms),
        "array_format": envelope.array_format.value,
        "lengths": [len(envelope.program), len(envelope.inputs), len(weights)],
        "has_weights": envelope.weights is not None,
    }
    header_bytes = json.dumps(header, sort_keys=True, separators=(",", ":")).encode()
    prefix = _PREFIX.pack(MAGIC, FORMAT_VERSION, len(header_bytes))
    return b"".join((prefix, header_bytes, envelope.program, envelope.inputs, weights))


def decode_envelope(data: bytes, *, max_bytes: int = MAX_ENVELOPE_BYTES) -> ProgramEnvelope:
    """Parse and check an envelope; raise :class:`ProgramFormatError` on anything malformed."""
    if len(data) > max_bytes:
        raise ProgramFormatError(f"envelope of {len(data)} bytes exceeds the cap {max_bytes}")
    if len(data) < _PREFIX.size:
        raise ProgramFormatError("envelope shorter than its fixed prefix")
    magic, version, header_len = _PREFIX.unpack_from(data)
    if magic != MAGIC:
        raise ProgramFormatError("not a tpumarket program envelope (bad magic)")
    if version != FORMAT_VERSION:
        raise ProgramFormatError(f"unsupported envelope format version {version}")
    if header_len > MAX_HEADER_BYTES or _PREFIX.size + header_len > len(data):
        raise ProgramFormatError(f"bad header length {header_len}")
    start = _PREFIX.size + header_len
    try:
        header = json.loads(data[_PREFIX.size : start])
        lengths = [int(n) for n in header["lengths"]]
        platforms = tuple(str(p) for p in header["platforms"])
        producer = ProducerVersions(
            jax=str(header["jax"]),
            jaxlib=str(header["jaxlib"]),
            calling_convention=int(header["calling_convention"]),
        )
        array_format = ArrayFormat(header["array_format"])
        has_weights = bool(header["has_weights"])
        program_sha = bytes.fromhex(header["program_sha256"])
        inputs_sha = bytes.fromhex(header["inputs_sha256"])
    except (ValueError, KeyError, TypeError) as exc:
        raise ProgramFormatError(f"bad envelope header: {exc}") from exc
    if len(lengths) != 3 or any(n < 0 for n in lengths) or start + sum(lengths) != len(data):
        raise ProgramFormatError("section lengths do not add up to the envelope size")
    program_len, inputs_len, weights_len = lengths
    if weights_len and not has_weights:
        raise ProgramFormatError("weights section present but has_weights is false")
    program = data[start : start + program_len]
    inputs = data[start + program_len : start + program_len + inputs_len]
    weights = data[start + program_len + inputs_len :] if has_weights else None
    envelope = ProgramEnvelope(
        program=bytes(program),
        inputs=bytes(inputs),
        program_sha256=program_sha,
        inputs_sha256=inputs_sha,
        producer=producer,
        platforms=platforms,
        array_format=array_format,
        weights=None if weights is None else bytes(weights),
    )
    envelope.check()
    return envelope


def split_envelope(data: bytes) -> tuple[bytes, bytes, bytes]:
    """Split an envelope into (frame, program, weights) for storage by content hash.

    ``frame`` is the envelope with its program and weights sections cut out (the prefix, the
    header and the inputs); :func:`join_envelope` puts them back, byte for byte. Raise
    :class:`ProgramFormatError` unless the prefix, header and section lengths are well formed
    (the hashes are not checked here: :func:`decode_envelope` does that).
    """
    if len(data) < _PREFIX.size:
        raise ProgramFormatError("envelope shorter than its fixed prefix")
    magic, version, header_len = _PREFIX.unpack_from(data)
    start = _PREFIX.size + header_len
    if magic != MAGIC or version != FORMAT_VERSION or start > len(data):
        raise ProgramFormatError("not an envelope of this format")
    try:
        program_len, inputs_len, weights_len = (
            int(n) for n in json.loads(data[_PREFIX.size : start])["lengths"]
        )
    except (ValueError, KeyError, TypeError) as exc:
        raise ProgramFormatError(f"bad envelope header: {exc}") from exc
    inputs_start = start + program_len
    inputs_end = inputs_start + inputs_len
    if min(program_len, inputs_len, weights_len) < 0 or inputs_end + weights_len != len(data):
        raise ProgramFormatError("section lengths do not add up to the envelope size")
    frame = data[:start] + data[inputs_start:inputs_end]
    return frame, data[start:inputs_start], data[inputs_end:]


def join_envelope(frame: bytes, program: bytes, weights: bytes) -> bytes:
    """Return the envelope :func:`split_envelope` split into these three parts."""
    start = _PREFIX.size + _PREFIX.unpack_from(frame)[2]
    return b"".join((frame[:start], program, frame[start:], weights))


# ---- binding a task to its signed request ------------------------------------------------

_HASH_DOMAIN_COMPILE_TARGET: Final = b"tpumarket.compile-target.v1"
MAX_TARGET_CHARS: Final = 64
_KIND_COMPILE: Final = 0  # mirrors contracts.messages.KIND_COMPILE
_KIND_INFERENCE: Final = 1  # mirrors contracts.messages.KIND_INFERENCE


def check_target_name(target: str) -> bytes:
    """Return the UTF-8 bytes of a compile target name; raise on empty, long or odd names.

    A target is printable ASCII without spaces (``local``, ``cpu``, ``v5e:1x1``), at most
    :data:`MAX_TARGET_CHARS` characters, so it travels unchanged in an HTTP header.
    """
    if not target or len(target) > MAX_TARGET_CHARS:
        raise ProgramFormatError(f"compile target must have 1..{MAX_TARGET_CHARS} characters")
    if not all("!" <= ch <= "~" for ch in target):
        raise ProgramFormatError(f"compile target {target!r} must be printable ASCII, no spaces")
    return target.encode("ascii")


def compile_input_hash(target: str, inputs_sha256: bytes) -> bytes:
    """Return the ``TaskRequest.inputHash`` of a compile task for ``target``.

    ``sha256("tpumarket.compile-target.v1" || u8 len(target) || target || inputs_sha256)``:
    domain-separated (it can never equal an inference task's plain inputs hash), length-prefixed
    (no two targets share a preimage), over the exact target string the client sends.
    """
    if len(inputs_sha256) != 32:
        raise ProgramFormatError("inputs_sha256 must be 32 bytes")
    name = check_target_name(target)
    return hashlib.sha256(
        _HASH_DOMAIN_COMPILE_TARGET + bytes([len(name)]) + name + inputs_sha256
    ).digest()


def request_input_hash(kind: int, envelope: ProgramEnvelope, target: str | None = None) -> bytes:
    """Return the ``inputHash`` a client signs for ``envelope`` run as a task of ``kind``.

    Inference (kind 1): the envelope's inputs hash. Compile (kind 0): :func:`compile_input_hash`
    over ``target`` (required) and the envelope's inputs hash.
    """
    if kind == _KIND_INFERENCE:
        if target is not None:
            raise ProgramFormatError("an inference task takes no compile target")
        return envelope.inputs_sha256
    if kind == _KIND_COMPILE:
        if target is None:
            raise ProgramFormatError("a compile task needs a target such as 'local' or 'v5e:1x1'")
        return compile_input_hash(target, envelope.inputs_sha256)
    raise ProgramFormatError(f"unknown task kind {kind}")
