"""The program envelope: round trips, hashes, caps, and refusal of malformed bytes."""

from __future__ import annotations

import contextlib
import hashlib
import io
import struct

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from programs.envelope import (
    MAGIC,
    ArrayFormat,
    ProducerVersions,
    ProgramEnvelope,
    ProgramFormatError,
    decode_arrays,
    decode_envelope,
    encode_arrays,
    encode_envelope,
    inputs_hash,
    join_envelope,
    outputs_hash,
    program_hash,
    split_envelope,
)

PRODUCER = ProducerVersions(jax="0.10.2", jaxlib="0.10.2", calling_convention=10)


def make(
    weights: bytes | None = None, fmt: ArrayFormat = ArrayFormat.SAFETENSORS
) -> ProgramEnvelope:
    inputs = encode_arrays({"0": np.arange(6, dtype=np.float32).reshape(2, 3)}, fmt)
    return ProgramEnvelope.create(
        program=b"\x01program-bytes",
        inputs=inputs,
        weights=weights,
        producer=PRODUCER,
        platforms=("cpu", "tpu"),
        array_format=fmt,
    )


def test_hashes_are_32_byte_sha256() -> None:
    assert program_hash(b"abc") == hashlib.sha256(b"abc").digest()
    assert outputs_hash(b"abc") == hashlib.sha256(b"abc").digest()
    assert inputs_hash(b"abc") == hashlib.sha256(b"abc").digest()
    assert len(inputs_hash(b"abc", b"w")) == 32


def test_inputs_hash_when_weights_and_inputs_swapped_then_differs() -> None:
    assert inputs_hash(b"a", b"b") != inputs_hash(b"b", b"a")
    assert inputs_hash(b"a", b"") != inputs_hash(b"a")


@pytest.mark.parametrize("fmt", list(ArrayFormat))
def test_envelope_round_trips_with_weights(fmt: ArrayFormat) -> None:
    weights = encode_arrays({"1": np.ones((3,), np.int32)}, fmt)
    envelope = make(weights, fmt)
    decoded = decode_envelope(encode_envelope(envelope))
    assert decoded == envelope
    args = decoded.arguments()
    np.testing.assert_array_equal(args["0"], np.arange(6, dtype=np.float32).reshape(2, 3))
    np.testing.assert_array_equal(args["1"], np.ones((3,), np.int32))


def test_checked_envelope_carries_its_weights_digest_so_weights_are_hashed_once() -> None:
    weights = encode_arrays({"1": np.ones((3,), np.int32)})
    decoded = decode_envelope(encode_envelope(make(weights, ArrayFormat.SAFETENSORS)))
    assert decoded.weights_sha256 == hashlib.sha256(weights).digest()
    assert (
        decode_envelope(encode_envelope(make(None, ArrayFormat.SAFETENSORS))).weights_sha256 is None
    )


def test_envelope_when_program_tampered_then_hash_mismatch() -> None:
    wire = bytearray(encode_envelope(make()))
    wire[-len(make().inputs) - 1] ^= 0xFF  # last byte of the program section
    with pytest.raises(ProgramFormatError, match="program_sha256"):
        decode_envelope(bytes(wire))


def test_envelope_when_bad_magic_or_truncated_then_rejected() -> None:
    wire = encode_envelope(make())
    with pytest.raises(ProgramFormatError, match="magic"):
        decode_envelope(b"XXXX" + wire[4:])
    with pytest.raises(ProgramFormatError):
        decode_envelope(wire[:-1])
    with pytest.raises(ProgramFormatError, match="prefix"):
        decode_envelope(wire[:3])


def test_envelope_when_header_length_lies_then_rejected() -> None:
    wire = encode_envelope(make())
    lying = struct.pack(">4sBI", MAGIC, 1, 2**31) + wire[9:]
    with pytest.raises(ProgramFormatError, match="header length"):
        decode_envelope(lying)


def test_envelope_when_over_size_cap_then_rejected_before_parsing() -> None:
    with pytest.raises(ProgramFormatError, match="exceeds the cap"):
        decode_envelope(b"\x00" * 1000, max_bytes=999)


def test_envelope_when_unknown_platform_then_rejected() -> None:
    with pytest.raises(ProgramFormatError, match="platforms"):
        ProgramEnvelope.create(program=b"p", inputs=b"", producer=PRODUCER, platforms=("quantum",))


def test_arguments_when_name_in_weights_and_inputs_then_rejected() -> None:
    envelope = make(encode_arrays({"0": np.ones((1,), np.float32)}))
    with pytest.raises(ProgramFormatError, match="both"):
        envelope.arguments()


def test_npz_with_object_array_is_refused_without_unpickling() -> None:
    buffer = io.BytesIO()
    np.savez(buffer, evil=np.array([{"a": 1}], dtype=object))
    with pytest.raises(ProgramFormatError, match="npz"):
        decode_arrays(buffer.getvalue(), ArrayFormat.NPZ)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=400))
def test_decode_envelope_on_any_bytes_returns_or_raises_format_error(data: bytes) -> None:
    with contextlib.suppress(ProgramFormatError):
        decode_envelope(MAGIC + b"\x01" + data)


@settings(max_examples=200, deadline=None)
@given(st.integers(min_value=0), st.integers(min_value=0, max_value=255))
def test_decode_envelope_on_single_byte_flip_never_raises_other_errors(
    pos: int, value: int
) -> None:
    wire = bytearray(encode_envelope(make()))
    wire[pos % len(wire)] = value
    with contextlib.suppress(ProgramFormatError):
        decode_envelope(bytes(wire))


@given(
    program=st.binary(min_size=1, max_size=300),
    inputs=st.binary(max_size=300),
    weights=st.one_of(st.none(), st.binary(max_size=300)),
)
def test_split_envelope_then_join_gives_the_same_bytes(
    program: bytes, inputs: bytes, weights: bytes | None
) -> None:
    data = encode_envelope(
        ProgramEnvelope.create(
            program=program,
            inputs=inputs,
            producer=ProducerVersions(jax="0.10.2", jaxlib="0.10.2", calling_convention=9),
            platforms=("cpu",),
            weights=weights,
        )
    )
    frame, cut_program, cut_weights = split_envelope(data)
    assert (cut_program, cut_weights) == (program, weights or b"")
    assert len(frame) == len(data) - len(program) - len(weights or b"")
    assert join_envelope(frame, cut_program, cut_weights) == data


@pytest.mark.parametrize("data", [b"", b"TPMP", b"XXXX\x01\x00\x00\x00\x02{}", b"pending"])
def test_split_envelope_when_not_an_envelope_then_format_error(data: bytes) -> None:
    with pytest.raises(ProgramFormatError):
        split_envelope(data)
