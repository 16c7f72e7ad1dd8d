"""Resource limits of sandbox workers."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass

from programs.rules import DEFAULT_MAX_NESTING, DEFAULT_MAX_OPS


@dataclass(frozen=True, slots=True)
class SandboxLimits:
    """Caps and hard timeouts applied to every task; the parent enforces the timeouts."""

    max_envelope_bytes: int = 256 * 1024 * 1024
    max_ops: int = DEFAULT_MAX_OPS  # the client's export checks by the same caps
    max_nesting: int = DEFAULT_MAX_NESTING  # regions in regions, through calls
    max_output_bytes: int = 512 * 1024 * 1024
    address_space_bytes: int = 16 << 30
    start_timeout_s: float = 120.0
    validate_timeout_s: float = 30.0
    compile_timeout_s: float = 120.0
    execute_timeout_s: float = 60.0
    max_tasks_per_worker: int = 10_000
    compiled_cache_entries: int = 32
    open_files: int = 4096
    file_size_bytes: int = 8 << 30
    processes: int = 4096
    cpu_seconds_per_task: int = 3600
    nice: int = 0  # added to the worker's nice value at start (validators yield the CPU)
    warm_up: bool = True  # compile a tiny program before saying ready (executors)
    # A validator is retired after this many programs its StableHLO parser refused. It holds
    # nothing of anyone's; every program it passes is parsed again by the executing worker,
    # which is retired at its first parser refusal.
    validator_refusals: int = 8
    # Start workers whose measured walls fall short of full isolation (no bubblewrap, root,
    # capabilities, no syscall allowlist, sockets): only where the operator says so.
    weak_isolation: bool = False

    def __post_init__(self) -> None:
        """Reject limits that cannot work."""
        for name in (
            "max_envelope_bytes",
            "max_ops",
            "max_nesting",
            "max_output_bytes",
            "address_space_bytes",
            "max_tasks_per_worker",
            "compiled_cache_entries",
            "open_files",
            "file_size_bytes",
            "processes",
            "cpu_seconds_per_task",
            "validator_refusals",
        ):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive")
        if not 0 <= self.nice <= 19:
            raise ValueError("nice must be within 0..19")
        for name in (
            "start_timeout_s",
            "validate_timeout_s",
            "compile_timeout_s",
            "execute_timeout_s",
        ):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive")


def limits_to_json(limits: SandboxLimits) -> str:
    """Return ``limits`` as the JSON argument a worker process reads."""
    return json.dumps(dataclasses.asdict(limits), sort_keys=True)
