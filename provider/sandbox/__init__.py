"""Sandboxed compile and inference of untrusted ``jax.export`` programs in spawned workers."""

from provider.sandbox.limits import SandboxLimits
from provider.sandbox.pool import WorkerInfo
from provider.sandbox.results import (
    CompileResult,
    CostFigures,
    InferenceResult,
    MemoryFigures,
    TaskFailure,
)
from provider.sandbox.sandbox import Sandbox

__all__ = [
    "CompileResult",
    "CostFigures",
    "InferenceResult",
    "MemoryFigures",
    "Sandbox",
    "SandboxLimits",
    "TaskFailure",
    "WorkerInfo",
]
