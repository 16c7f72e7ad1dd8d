"""Pure validation rules: versions, dialects, custom-call allowlist, op cap, targets."""

from __future__ import annotations

import pytest

from programs.custom_calls import check_custom_call
from programs.refusals import Category, RejectedProgram
from programs.rules import (
    VersionRanges,
    artifact_stablehlo_version,
    check_calling_convention,
    check_op,
    check_op_count,
    check_producer_jax,
    check_stablehlo,
    parse_version,
)
from provider.sandbox.targets import kind_slug, parse_target

RANGES = VersionRanges(
    jax=(0, 10, 2),
    calling_convention_min=9,
    calling_convention_max=10,
    stablehlo_min=(0, 9, 0),
    stablehlo_max=(1, 17, 0),
)


def category_of(call: object) -> Category:
    assert callable(call)
    with pytest.raises(RejectedProgram) as info:
        call()
    return info.value.category


@pytest.mark.parametrize(
    "name",
    [
        "stablehlo.add",
        "stablehlo.dot_general",
        "func.return",
        "chlo.erf",
        "sdy.mesh",
        "stablehlo.while",
        "func.call",
    ],
)
def test_check_op_accepts_allowed_dialects(name: str) -> None:
    check_op(name, None)


@pytest.mark.parametrize(
    "name",
    [
        "stablehlo.outfeed",
        "stablehlo.infeed",
        "stablehlo.send",
        "stablehlo.recv",
        "builtin.module",
        "tpu.matmul",
        "mhlo.add",
        "llvm.call",
        "gpu.launch",
    ],
)
def test_check_op_rejects_forbidden_ops_and_dialects(name: str) -> None:
    assert category_of(lambda: check_op(name, None)) == "unsupported_op"


@pytest.mark.parametrize(
    "target",
    [
        "Sharding",
        "shape_assertion",
        "lapack_sgetrf_ffi",
        "lapack_zheevd_ffi",
        "Qr",
        "LuDecomposition",
    ],
)
def test_custom_call_allowlist_accepts_xla_owned_targets(target: str) -> None:
    check_op("stablehlo.custom_call", target)


@pytest.mark.parametrize(
    "target",
    [
        "xla_ffi_python_cpu_callback",
        "xla_python_cpu_callback",
        "xla_python_gpu_callback",
        "tpu_custom_call",
        "mosaic_gpu_v2",
        "__gpu$xla.gpu.triton",
        "tf.call_tf_function",
        "lapack_sgetrf_ffi_evil",
        "cusolver_potrf_ffi",
        "cu_threefry2x32_ffi",
        "lapack_sgesvd_ffi",
        "",
        None,
    ],
)
def test_custom_call_allowlist_rejects_opaque_targets(target: str | None) -> None:
    assert category_of(lambda: check_op("stablehlo.custom_call", target)) == "unsupported_op"


def test_versions() -> None:
    assert parse_version("0.10.2.dev20260101") == (0, 10, 2)
    check_producer_jax("0.10.2", RANGES)
    check_producer_jax("0.4.30", RANGES)
    assert category_of(lambda: check_producer_jax("0.11.0", RANGES)) == "version_mismatch"
    assert category_of(lambda: check_producer_jax("garbage", RANGES)) == "malformed_input"
    check_calling_convention(9, RANGES)
    assert category_of(lambda: check_calling_convention(8, RANGES)) == "version_mismatch"
    check_stablehlo((1, 15, 0), RANGES)
    assert category_of(lambda: check_stablehlo((1, 18, 0), RANGES)) == "version_mismatch"


def test_artifact_version_is_read_from_the_header() -> None:
    assert artifact_stablehlo_version(b"ML\xefR\rStableHLO_v1.15.0\x00\x01") == (1, 15, 0)
    assert category_of(lambda: artifact_stablehlo_version(b"PK\x03\x04")) == "malformed_input"
    assert category_of(lambda: artifact_stablehlo_version(b"ML\xefR\rMLIR\x00")) == (
        "malformed_input"
    )


def test_op_count_cap() -> None:
    check_op_count(10, 10)
    assert category_of(lambda: check_op_count(11, 10)) == "unsupported_op"


def test_targets() -> None:
    assert not parse_target("local").is_aot
    one = parse_target("v5e:1x1")
    assert (one.aot_topology, one.chips, one.chips_per_host_bounds) == ("v5e:1x1", 1, (1, 1, 1))
    four = parse_target("v5e:2x2")
    assert (four.chips, four.chips_per_host_bounds) == (4, None)
    assert parse_target("v5e").name == "v5e:1x1"
    with pytest.raises(ValueError):
        parse_target("h100")
    assert kind_slug("TPU v5 lite") == "tpu-v5-lite"


F32_8x8 = ((8, 8), "f32")


def test_custom_call_buffers_lapack_getrf() -> None:
    ok = [F32_8x8, ((8,), "i32"), ((), "i32")]
    check_custom_call("lapack_sgetrf_ffi", [F32_8x8], ok, {})
    for bad in (
        [((2, 2), "f32"), ((8,), "i32"), ((), "i32")],
        [F32_8x8, ((1,), "i32"), ((), "i32")],
        [F32_8x8, ((8,), "i32")],
        [F32_8x8, ((8,), "i32"), ((), "i32"), ((), "i32")],
    ):
        assert category_of(
            lambda bad=bad: check_custom_call("lapack_sgetrf_ffi", [F32_8x8], bad, {})
        ) == ("malformed_input")
    assert category_of(lambda: check_custom_call("lapack_zgetrf_ffi", [F32_8x8], ok, {})) == (
        "malformed_input"
    )
    dynamic = [((-1, 8), "f32")]
    assert category_of(lambda: check_custom_call("lapack_sgetrf_ffi", dynamic, ok, {})) == (
        "malformed_input"
    )


def test_custom_call_buffers_follow_the_kernel_options() -> None:
    a, b = ((5, 5), "f32"), ((5, 3), "f32")
    options = {"side": ord("L"), "uplo": ord("U"), "trans_x": ord("N"), "diag": ord("N")}
    check_custom_call("lapack_strsm_ffi", [a, b], [b], options)
    right = {**options, "side": ord("R")}  # reads a 3x3 triangle: a 5x5 one is a mismatch
    assert category_of(lambda: check_custom_call("lapack_strsm_ffi", [a, b], [b], right)) == (
        "malformed_input"
    )
    odd = {**options, "side": ord("X")}
    assert category_of(lambda: check_custom_call("lapack_strsm_ffi", [a, b], [b], odd)) == (
        "malformed_input"
    )
    x = ((5, 3), "f32")
    full = [x, ((3,), "f32"), ((5, 5), "f32"), ((3, 3), "f32"), ((), "i32")]
    reduced = [x, ((3,), "f32"), ((5, 3), "f32"), ((3, 3), "f32"), ((), "i32")]
    check_custom_call("lapack_sgesdd_ffi", [x], full, {"mode": ord("A")})
    check_custom_call("lapack_sgesdd_ffi", [x], reduced, {"mode": ord("S")})
    assert (
        category_of(
            lambda: check_custom_call("lapack_sgesdd_ffi", [x], reduced, {"mode": ord("A")})
        )
        == "malformed_input"
    )
    h = ((4, 4), "f32")
    hessenberg = [h, ((3,), "f32"), ((), "i32")]
    check_custom_call("lapack_sgehrd_ffi", [h], hessenberg, {"low": 1, "high": 4})
    assert (
        category_of(
            lambda: check_custom_call("lapack_sgehrd_ffi", [h], hessenberg, {"low": 1, "high": 99})
        )
        == "malformed_input"
    )


def test_custom_call_buffers_xla_owned() -> None:
    check_custom_call("Sharding", [F32_8x8], [F32_8x8], {})
    assert category_of(lambda: check_custom_call("Sharding", [F32_8x8], [((4, 8), "f32")], {})) == (
        "malformed_input"
    )
    check_custom_call("shape_assertion", [((), "i1"), ((), "i32")], [], {})
    assert category_of(lambda: check_custom_call("shape_assertion", [F32_8x8], [], {})) == (
        "malformed_input"
    )
