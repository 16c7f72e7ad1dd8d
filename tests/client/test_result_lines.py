"""What the job commands print for a compile result and a settlement instant."""

from __future__ import annotations

import pytest

from client.job_results import byte_size, compile_line
from client.job_status import utc

GIB = 1 << 30


@pytest.mark.parametrize(
    ("count", "text"),
    [(0, "0 B"), (1023, "1023 B"), (1536, "1.50 KiB"), (int(15.75 * GIB), "15.75 GiB")],
)
def test_byte_size_when_bytes_then_binary_units(count: int, text: str) -> None:
    assert byte_size(count) == text


def test_compile_line_when_target_memory_known_then_needed_of_total() -> None:
    report = {
        "device_kind": "TPU v5 lite",
        "memory_total_bytes": 3 * GIB // 2,
        "available_bytes": int(15.75 * GIB),
    }

    assert compile_line(report) == "compiled for TPU v5 lite, memory 1.50 GiB of 15.75 GiB (9.5%)"


def test_compile_line_when_target_memory_unknown_then_needed_alone() -> None:
    report = {"device_kind": "cpu", "memory_total_bytes": 2048, "available_bytes": None}

    assert compile_line(report) == "compiled for cpu, memory 2.00 KiB"


def test_settle_by_when_printed_then_a_utc_time_not_unix_seconds() -> None:
    assert utc(1_796_368_112) == "2026-12-04 07:08:32 UTC"
