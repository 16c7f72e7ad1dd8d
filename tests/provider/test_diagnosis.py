"""The pure failure classifier, fed messages captured from real JAX / XLA runs."""

from __future__ import annotations

import pytest

from provider.diagnosis import (
    COMPILER_CRASH_HINTS,
    COMPILER_ERROR_HINTS,
    CPU_LIMIT_HINTS,
    HINTS,
    KILLED_HINTS,
    MISSING_OP_HINTS,
    SUCCESS_CODE,
    VERIFIER_HINTS,
    Category,
    Stage,
    classify,
    crash,
    first_meaningful_line,
    parse_size,
    timeout,
)

GIB = 1 << 30

# (message as raised, stage, expected category, expected op)
REAL_MESSAGES = [
    # TOOLCHAIN.md, "Failure messages seen"
    (
        "struct.error: unpack_from requires a buffer of at least 3201280996 bytes for unpacking 4 "
        "bytes at offset 3201280992 (actual buffer size is 200)",
        Stage.PARSE,
        Category.MALFORMED_INPUT,
        None,
    ),
    (
        "JaxRuntimeError: INVALID_ARGUMENT: Failed to deserialize StableHLO",
        Stage.VALIDATE,
        Category.MALFORMED_INPUT,
        None,
    ),
    (
        "ValueError: Function 'double' was exported for platforms '('tpu',)' but it is used on "
        "'('cpu',)'.",
        Stage.COMPILE,
        Category.PLATFORM_MISMATCH,
        None,
    ),
    (
        "JaxRuntimeError: INVALID_ARGUMENT: Length of device assignment 1 is not equal to the size "
        "of the mesh 8",
        Stage.COMPILE,
        Category.DEVICE_COUNT_MISMATCH,
        None,
    ),
    (
        "ValueError: Function <lambda> was exported for 8 devices and is called in a context with "
        "1 devices, which is not allowed.",
        Stage.COMPILE,
        Category.DEVICE_COUNT_MISMATCH,
        None,
    ),
    (
        "ValueError: Function f was exported for 0 devices and is called in a context with 1 "
        "devices, which is not allowed.",
        Stage.COMPILE,
        Category.VERSION_MISMATCH,
        None,
    ),
    (
        "JaxRuntimeError: NOT_FOUND: No registered implementation for untyped custom call to "
        "tpu_custom_call for Host",
        Stage.COMPILE,
        Category.UNSUPPORTED_OP,
        "tpu_custom_call",
    ),
    (
        "JaxRuntimeError: INTERNAL: Custom emitter for lapack_sgetrf_ffi not found",
        Stage.COMPILE,
        Category.UNSUPPORTED_OP,
        "lapack_sgetrf_ffi",
    ),
    (
        "JaxRuntimeError: UNIMPLEMENTED: Stable sorting of more than 2^31-1 elements",
        Stage.COMPILE,
        Category.UNSUPPORTED_OP,
        None,
    ),
    (
        "JaxRuntimeError: INTERNAL: Unexpected operand type for FFT: c128",
        Stage.COMPILE,
        Category.UNSUPPORTED_OP,
        "FFT",
    ),
    (
        "ValueError: Dtype mismatch for args[1]: expected float32 and called with int32",
        Stage.COMPILE,
        Category.BAD_ARGUMENTS,
        None,
    ),
    (
        "ValueError: Shape mismatch for args[1].shape[0] (expected same constant): expected "
        "(4, 16) and called with (5, 16)",
        Stage.COMPILE,
        Category.BAD_ARGUMENTS,
        None,
    ),
    (
        "ValueError: The invocation args and kwargs must have the same pytree structure as when "
        "the function '<lambda>' was exported, but they have the following structural "
        "differences:\n   - args is a tuple of length 1 in the invocation and a tuple of length 2",
        Stage.COMPILE,
        Category.BAD_ARGUMENTS,
        None,
    ),
]


@pytest.mark.parametrize(("message", "stage", "category", "op"), REAL_MESSAGES)
def test_classify_real_message(
    message: str, stage: Stage, category: Category, op: str | None
) -> None:
    diagnosis = classify(message, stage)
    assert diagnosis.category is category
    assert diagnosis.op == op
    assert diagnosis.hints
    assert "\n" not in diagnosis.message


def test_classify_tpu_hbm_oom_extracts_required_and_available_bytes() -> None:
    # Captured from the v5e compiler via libtpu on this host.
    text = (
        "JaxRuntimeError: RESOURCE_EXHAUSTED: Ran out of memory on HBM, the total memory "
        "required for HLO temporaries (26.84G) exceeds available HBM (15.75G)."
    )
    diagnosis = classify(text, Stage.COMPILE)
    assert diagnosis.category is Category.OOM
    assert diagnosis.required_bytes == int(26.84 * GIB)
    assert diagnosis.available_bytes == int(15.75 * GIB)
    assert any("batch" in hint for hint in diagnosis.hints)


def test_classify_toolchain_hbm_oom_form() -> None:
    text = (
        "RESOURCE_EXHAUSTED: Ran out of memory on HBM ... required (36.00G) exceeds "
        "available HBM (15.75G)"
    )
    diagnosis = classify(text, Stage.COMPILE)
    assert (diagnosis.required_bytes, diagnosis.available_bytes) == (36 * GIB, int(15.75 * GIB))


def test_classify_cpu_allocation_oom_extracts_required_bytes() -> None:
    # Captured from a CPU worker under RLIMIT_AS = 4 GiB.
    text = "JaxRuntimeError: RESOURCE_EXHAUSTED: Out of memory allocating 1073741824 bytes."
    diagnosis = classify(text, Stage.EXECUTE)
    assert diagnosis.category is Category.OOM
    assert diagnosis.required_bytes == 1 << 30
    assert diagnosis.available_bytes is None


def test_classify_unknown_message_falls_back_by_stage() -> None:
    assert classify("boom", Stage.PARSE).category is Category.MALFORMED_INPUT
    assert classify("boom", Stage.COMPILE).category is Category.UNSUPPORTED_OP
    assert classify("boom", Stage.EXECUTE).category is Category.EXECUTE_ERROR


def test_codes_are_stable_and_distinct() -> None:
    expected = {
        "malformed_input": 1,
        "version_mismatch": 2,
        "platform_mismatch": 3,
        "device_count_mismatch": 4,
        "unsupported_op": 5,
        "oom": 6,
        "bad_arguments": 7,
        "compile_timeout": 8,
        "execute_timeout": 9,
        "worker_crash": 10,
        "execute_error": 11,
    }
    assert {c.value: c.code for c in Category} == expected
    assert SUCCESS_CODE == 0
    for category in Category:
        assert Category.from_code(category.code) is category
    with pytest.raises(ValueError):
        Category.from_code(0)


def test_timeout_and_crash_diagnoses() -> None:
    assert timeout(Stage.COMPILE, 2).category is Category.COMPILE_TIMEOUT
    assert timeout(Stage.EXECUTE, 2).category is Category.EXECUTE_TIMEOUT
    assert timeout(Stage.PARSE, 2).category is Category.MALFORMED_INPUT
    died = crash(Stage.EXECUTE, -9)
    assert died.category is Category.WORKER_CRASH
    assert "signal 9" in died.message


@pytest.mark.parametrize(
    ("stage", "exitcode", "hints", "named"),
    [
        (Stage.COMPILE, -11, COMPILER_CRASH_HINTS, "SIGSEGV"),
        (Stage.COMPILE, -7, COMPILER_CRASH_HINTS, "SIGBUS"),
        (Stage.EXECUTE, -11, HINTS[Category.WORKER_CRASH], "SIGSEGV"),
        (Stage.EXECUTE, -6, HINTS[Category.WORKER_CRASH], "SIGABRT"),
        (Stage.EXECUTE, -9, KILLED_HINTS, "SIGKILL"),
        (Stage.COMPILE, -24, CPU_LIMIT_HINTS, "SIGXCPU"),
        (Stage.EXECUTE, 3, HINTS[Category.WORKER_CRASH], "code 3"),
    ],
)
def test_crash_hint_when_worker_dies_then_follows_the_signal_and_stage(
    stage: Stage, exitcode: int, hints: tuple[str, ...], named: str
) -> None:
    died = crash(stage, exitcode)
    assert died.category is Category.WORKER_CRASH
    assert died.hints == hints
    assert named in died.message and str(stage) in died.message
    assert not any("custom call" in hint for hint in died.hints)


def test_compile_error_without_a_custom_call_when_classified_then_no_custom_call_hint() -> None:
    unknown = classify("INTERNAL: RET_CHECK failure (xla/service/foo.cc:12) x != y", Stage.COMPILE)
    assert unknown.category is Category.UNSUPPORTED_OP
    assert unknown.hints == COMPILER_ERROR_HINTS
    named = classify("UNIMPLEMENTED: op 'stablehlo.fft' is not supported here", Stage.COMPILE)
    assert named.op == "stablehlo.fft"
    assert named.hints == MISSING_OP_HINTS
    custom = classify(
        "No registered implementation for custom call to my_kernel for platform cpu", Stage.COMPILE
    )
    assert custom.op == "my_kernel"
    assert custom.hints == HINTS[Category.UNSUPPORTED_OP]


def test_verifier_refusal_when_it_gives_no_reason_then_says_what_was_checked() -> None:
    text = (
        "ValueError: Cannot lower jaxpr with verifier errors. Define JAX_DUMP_IR_TO to dump "
        "the module."
    )
    diagnosis = classify(text, Stage.COMPILE)
    assert diagnosis.category is Category.UNSUPPORTED_OP
    assert diagnosis.message.strip() and "verification" in diagnosis.message
    assert "named no op and gave no reason" in diagnosis.message
    assert diagnosis.hints == VERIFIER_HINTS


def test_verifier_refusal_when_it_names_an_op_then_the_op_and_reason_reach_the_client() -> None:
    text = (
        "ValueError: Cannot lower jaxpr with verifier errors:\n"
        "\t'stablehlo.add' op requires compatible types for all operands and results\n"
        '\t\tat loc("jit(f)/add")\n'
        "custom_call anywhere in a dump is no reason\n"
    )
    diagnosis = classify(text, Stage.COMPILE)
    assert diagnosis.op == "stablehlo.add"
    assert "requires compatible types" in diagnosis.message
    assert diagnosis.hints == VERIFIER_HINTS


def test_first_meaningful_line_skips_traceback_noise() -> None:
    text = (
        "Traceback (most recent call last):\n"
        '  File "x.py", line 1, in <module>\n'
        "    f()\n"
        "jax.errors.JaxRuntimeError: RESOURCE_EXHAUSTED: Out of memory allocating 8 bytes.\n"
    )
    assert first_meaningful_line(text) == "RESOURCE_EXHAUSTED: Out of memory allocating 8 bytes."
    assert first_meaningful_line("ValueError: bad thing\nmore") == "bad thing"


@pytest.mark.parametrize(
    ("text", "expected"),
    [("36.00G", 36 * GIB), ("512M", 512 << 20), ("1234", 1234), ("1.5KiB", 1536), ("x", None)],
)
def test_parse_size(text: str, expected: int | None) -> None:
    assert parse_size(text) == expected
