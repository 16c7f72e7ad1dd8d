"""Sandboxed compile and inference of untrusted ``jax.export`` programs in spawned workers."""

from provider.sandbox.limits import SandboxLimits
from provider.sandbox.results import (
    CompileResult,
    CostFigures,
    InferenceResult,
    MemoryFigures,
    TaskFailure,
)
from provider.sandbox.sandbox import Sandbox
from provider.sandbox.worker_process import WorkerInfo

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
