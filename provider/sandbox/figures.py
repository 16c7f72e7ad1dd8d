"""Memory and cost figures of a compiled executable (runs in a worker; imports no JAX)."""

from __future__ import annotations

from typing import Any


def memory_figures(executable: Any) -> dict[str, int] | None:
    """Return a compiled executable's memory analysis in bytes, or None if it has none."""
    try:
        stats = executable.memory_analysis()
    except Exception:
        return None
    if stats is None:
        return None
    return {
        "argument_bytes": int(stats.argument_size_in_bytes),
        "output_bytes": int(stats.output_size_in_bytes),
        "temp_bytes": int(stats.temp_size_in_bytes),
        "alias_bytes": int(stats.alias_size_in_bytes),
        "generated_code_bytes": int(stats.generated_code_size_in_bytes),
    }


def total_bytes(memory: dict[str, int]) -> int:
    """Return the device bytes a program needs at once (aliased bytes counted once)."""
    return (
        memory["argument_bytes"]
        + memory["output_bytes"]
        + memory["temp_bytes"]
        + memory["generated_code_bytes"]
        - memory["alias_bytes"]
    )


def cost_figures(executable: Any) -> dict[str, float] | None:
    """Return a compiled executable's cost analysis (flops, bytes, transcendentals)."""
    try:
        cost = executable.cost_analysis()
    except Exception:
        return None
    if isinstance(cost, list):
        cost = cost[0] if cost else None
    if not cost:
        return None
    return {
        "flops": float(cost.get("flops", 0.0)),
        "bytes_accessed": float(cost.get("bytes accessed", 0.0)),
        "transcendentals": float(cost.get("transcendentals", 0.0)),
    }
