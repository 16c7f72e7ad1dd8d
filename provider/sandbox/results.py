"""Frozen results of sandbox tasks."""

from __future__ import annotations

from dataclasses import dataclass

from provider.diagnosis import Diagnosis


@dataclass(frozen=True, slots=True)
class MemoryFigures:
    """Device memory a compiled program needs, from XLA's ``memory_analysis``."""

    argument_bytes: int
    output_bytes: int
    temp_bytes: int
    alias_bytes: int
    generated_code_bytes: int

    @property
    def total_bytes(self) -> int:
        """Return the peak device memory the program needs (arguments + outputs + temps)."""
        return (
            self.argument_bytes
            + self.output_bytes
            + self.temp_bytes
            + self.generated_code_bytes
            - self.alias_bytes
        )


@dataclass(frozen=True, slots=True)
class CostFigures:
    """XLA's ``cost_analysis`` of a compiled program."""

    flops: float
    bytes_accessed: float
    transcendentals: float


@dataclass(frozen=True, slots=True)
class CompileResult:
    """A program compiled for a target, with the figures a compile-check sells."""

    program_sha256: bytes
    target: str
    platform: str
    device_kind: str
    compile_time_s: float
    cache_hit: bool
    memory: MemoryFigures | None
    cost: CostFigures | None
    available_bytes: int | None


@dataclass(frozen=True, slots=True)
class InferenceResult:
    """Outputs of one run, as safetensors bytes named by flat output index."""

    program_sha256: bytes
    inputs_sha256: bytes
    outputs: bytes
    outputs_sha256: bytes
    device_time_s: float
    compile_time_s: float
    cache_hit: bool
    platform: str
    device_kind: str


@dataclass(frozen=True, slots=True)
class TaskFailure:
    """A task that did not succeed; ``diagnosis`` says why and what to do."""

    diagnosis: Diagnosis
    program_sha256: bytes | None
    elapsed_s: float
    compile_time_s: float = 0.0
    device_time_s: float = 0.0
