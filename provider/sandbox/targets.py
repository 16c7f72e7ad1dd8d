"""Compile targets: the local devices, or a named TPU topology compiled ahead of time."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Any, Final

LOCAL_PLATFORMS: Final = frozenset({"cpu", "gpu", "tpu"})
_TOPOLOGY = re.compile(r"^(?P<gen>v4|v5e|v5p|v6e)(?::(?P<shape>\d{1,6}x\d{1,6}(?:x\d{1,6})?))?$")
# The largest slice of each generation (a full pod), in chips: a topology past it does not
# exist and is refused before any compiler sees it.
MAX_CHIPS: Final[dict[str, int]] = {"v4": 4096, "v5e": 256, "v5p": 8960, "v6e": 256}

# HBM per chip by device kind, used when a probe compile cannot measure it.
HBM_BYTES_BY_KIND: Final[dict[str, int]] = {
    "TPU v4": 32 << 30,
    "TPU v5": 95 << 30,
    "TPU v5 lite": 16 << 30,
    "TPU v6 lite": 32 << 30,
}
# The platform name a program must have been exported for, per JAX backend platform.
EXPORT_PLATFORM_ALIASES: Final[dict[str, tuple[str, ...]]] = {
    "cpu": ("cpu",),
    "tpu": ("tpu",),
    "gpu": ("cuda", "rocm"),
}


@dataclass(frozen=True, slots=True)
class Target:
    """Where a program is compiled: ``local`` devices or an ahead-of-time TPU topology."""

    name: str
    aot_topology: str | None = None
    chips: int = 1

    @property
    def is_aot(self) -> bool:
        """Whether this target is compile-only (no chip attached)."""
        return self.aot_topology is not None

    @property
    def chips_per_host_bounds(self) -> tuple[int, int, int] | None:
        """Bounds to pass for one-host topologies smaller than the default 2x2."""
        if self.aot_topology is None:
            return None
        dims = [int(d) for d in self.aot_topology.split(":")[1].split("x")]
        if self.chips < 4:
            return (dims[0], dims[1], dims[2] if len(dims) > 2 else 1)
        return None


def parse_target(name: str) -> Target:
    """Parse ``local``/``cpu``/``gpu``/``tpu`` or a TPU topology such as ``v5e:1x1``."""
    if name in LOCAL_PLATFORMS or name == "local":
        return Target(name=name)
    match = _TOPOLOGY.match(name)
    if match is None:
        raise ValueError(f"unknown compile target {name!r}")
    shape = match["shape"] or "1x1"
    chips = 1
    for dim in shape.split("x"):
        chips *= int(dim)
    if chips < 1:
        raise ValueError(f"empty topology {name!r}")
    if chips > MAX_CHIPS[match["gen"]]:
        raise ValueError(
            f"topology {name!r} has {chips} chips; the largest {match['gen']} slice has "
            f"{MAX_CHIPS[match['gen']]}"
        )
    return Target(
        name=f"{match['gen']}:{shape}", aot_topology=f"{match['gen']}:{shape}", chips=chips
    )


def platform_refusal(target: Target, platform: str) -> str | None:
    """Say why ``target`` cannot be compiled on a host whose devices are ``platform``.

    ``cpu``, ``gpu`` and ``tpu`` name the local devices' platform: on a host of another
    platform they would compile for the wrong device, so they are refused (a TPU topology
    such as ``v5e:1x1`` compiles ahead of time anywhere).
    """
    if target.is_aot or target.name == "local" or target.name == platform:
        return None
    return (
        f"target {target.name!r} names a platform this provider does not have: its devices "
        f"are {platform}; ask for 'local' or {platform!r}, or a TPU topology such as "
        "'v5e:1x1' to compile ahead of time"
    )


def kind_slug(device_kind: str) -> str:
    """Return a directory-safe name for a device kind (``TPU v5 lite`` -> ``tpu-v5-lite``)."""
    slug = re.sub(r"[^a-z0-9]+", "-", device_kind.lower()).strip("-")
    return slug or "unknown"


def aot_devices(target: Target) -> tuple[Any, ...]:
    """Return the devices of a TPU topology to compile for ahead of time (needs libtpu).

    When this process drives no TPU chip, libtpu serves only as a compiler, so several
    processes on one host may load it: its single-process lockfile is waived for them.
    """
    import jax
    from jax.experimental import topologies

    if target.aot_topology is None:
        raise ValueError(f"target {target.name} is not an ahead-of-time TPU topology")
    if jax.default_backend() != "tpu":
        os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    bounds = target.chips_per_host_bounds
    if bounds is not None:
        topology = topologies.get_topology_desc(
            target.aot_topology, "tpu", chips_per_host_bounds=bounds
        )
    else:
        topology = topologies.get_topology_desc(target.aot_topology, "tpu")
    return tuple(topology.devices)
