"""Discover what this host can sell: devices, versions, TPU compile targets, measured speed.

:func:`discover` imports JAX, so the daemon runs it inside a sandbox worker
(:meth:`provider.sandbox.Sandbox.capacity`); the dataclasses and wire helpers are pure.
"""

from __future__ import annotations

import glob
import importlib.util
import os
import re
import time
from dataclasses import asdict, dataclass
from typing import Any, Final

from provider.errors import CapacityError

DEFAULT_AOT_TARGETS: Final = ("v5e:1x1",)
_PLATFORM_ORDER: Final = ("tpu", "gpu", "cpu")
_HBM_AVAILABLE = re.compile(r"exceeds available HBM \(([0-9.]+\s*[KMGT]?)\)")


_TPU_KINDS: Final = {
    "tpu v2": "tpu-v2",
    "tpu v3": "tpu-v3",
    "tpu v4": "tpu-v4",
    "tpu v4 lite": "tpu-v4i",
    "tpu v5": "tpu-v5p",
    "tpu v5p": "tpu-v5p",
    "tpu v5 lite": "tpu-v5e",
    "tpu v5e": "tpu-v5e",
    "tpu v6 lite": "tpu-v6e",
    "tpu v6e": "tpu-v6e",
    "tpu7x": "tpu-v7x",
}
_GPU_MODEL = re.compile(r"\b([a-z]{1,4})\s?(\d{1,4})([a-z]?)\b")
_GPU_VENDOR_WORDS = re.compile(r"\b(nvidia|geforce|tesla|quadro|amd|radeon|instinct)\b")


def device_class(platform: str, device_kind: str) -> str:
    """Return the market's device class of a device: ``cpu``, ``tpu-v5e``, ``gpu-h100``, ...

    TPUs by generation (JAX calls a v5e ``TPU v5 lite``), GPUs by model (``NVIDIA H100 80GB
    HBM3`` is ``gpu-h100``); a device this table does not know keeps its platform's name with
    its kind's first model token, or the bare platform.
    """
    kind = " ".join(device_kind.lower().split())
    if platform == "cpu":
        return "cpu"
    if platform == "tpu":
        known = _TPU_KINDS.get(kind)
        if known is not None:
            return known
        match = re.search(r"v(\d+)\s*(lite|[a-z])?", kind)
        if match is None:
            return "tpu"
        suffix = "e" if match.group(2) == "lite" else (match.group(2) or "")
        return f"tpu-v{match.group(1)}{suffix}"
    if platform in ("gpu", "cuda", "rocm"):
        model = _GPU_MODEL.search(_GPU_VENDOR_WORDS.sub(" ", kind))
        if model is None:
            return "gpu"
        return "gpu-" + "".join(model.groups())
    return re.sub(r"[^a-z0-9-]", "", platform.lower()) or "unknown"


def compile_class(target: str) -> str:
    """Return the market class of compile checks for a TPU topology: ``v5e:2x2`` -> ``compile-v5e``.

    A host sells run time in its device class and, apart, compile checks in one class per
    TPU generation it compiles for ahead of time (a CPU host with libtpu sells
    ``compile-v5e``, never ``tpu-v5e``).
    """
    return "compile-" + target.split(":", 1)[0].lower()


@dataclass(frozen=True, slots=True)
class DeviceInfo:
    """The local devices JAX serves tasks on."""

    platform: str
    device_kind: str
    count: int
    memory_bytes: int | None

    @property
    def device_class(self) -> str:
        """Return the device class this host sells (see :func:`device_class`)."""
        return device_class(self.platform, self.device_kind)


@dataclass(frozen=True, slots=True)
class CompileTarget:
    """A compile-only target: a TPU topology compiled ahead of time without a chip."""

    name: str
    device_kind: str
    chips: int
    hbm_bytes: int | None


@dataclass(frozen=True, slots=True)
class Benchmark:
    """Measured matmul throughput of the first local device."""

    matmul_size: int
    dtype: str
    iterations: int
    seconds: float
    gflops: float


@dataclass(frozen=True, slots=True)
class Capacity:
    """What an advert states, every figure read or measured on this host."""

    devices: DeviceInfo
    jax_version: str
    jaxlib_version: str
    calling_convention_min: int
    calling_convention_max: int
    stablehlo_min: str
    stablehlo_max: str
    compile_targets: tuple[CompileTarget, ...]
    benchmark: Benchmark | None


def _local_devices(jax: Any) -> list[Any]:
    for platform in _PLATFORM_ORDER:
        try:
            devices = jax.devices(platform)
        except RuntimeError:
            continue
        if devices:
            return list(devices)
    raise CapacityError("JAX reports no devices")


def _memory_bytes(device: Any) -> int | None:
    try:
        stats = device.memory_stats()
    except Exception:
        return None
    if not stats or "bytes_limit" not in stats:
        return None
    return int(stats["bytes_limit"])


def measure_hbm_bytes(device: Any) -> int | None:
    """Measure a compile-only TPU device's usable HBM with a probe that cannot fit.

    XLA's TPU compiler states the available HBM when a program overflows it; a 256 GiB
    probe makes it say so. Returns None when the compiler does not say.
    """
    import importlib

    import numpy as np

    from provider.diagnosis import parse_size

    jax: Any = importlib.import_module("jax")

    sharding = jax.sharding.SingleDeviceSharding(device)
    probe = jax.ShapeDtypeStruct((1 << 36,), np.float32, sharding=sharding)
    try:
        jax.jit(lambda x: x * 2).lower(probe).compile()
    except Exception as exc:
        match = _HBM_AVAILABLE.search(str(exc))
        if match is not None:
            return parse_size(match.group(1))
    return None


def tpu_compiler_available() -> bool:
    """Whether libtpu is installed, so TPU programs can be compiled ahead of time here."""
    return importlib.util.find_spec("libtpu") is not None


def _compile_targets(names: tuple[str, ...]) -> tuple[CompileTarget, ...]:
    if not names or not tpu_compiler_available():
        return ()
    from provider.sandbox.targets import HBM_BYTES_BY_KIND, aot_devices, parse_target

    found = []
    for name in names:
        target = parse_target(name)
        if target.aot_topology is None:
            continue
        try:
            devices = aot_devices(target)
        except Exception:
            continue
        device: Any = devices[0]
        kind = str(device.device_kind)
        hbm = measure_hbm_bytes(device) or HBM_BYTES_BY_KIND.get(kind)
        found.append(
            CompileTarget(name=target.name, device_kind=kind, chips=len(devices), hbm_bytes=hbm)
        )
    return tuple(found)


def run_benchmark(device: Any, size: int = 512, min_seconds: float = 0.25) -> Benchmark:
    """Time float32 matmuls on ``device`` for about ``min_seconds`` and report GFLOP/s."""
    import jax
    import jax.numpy as jnp

    a = jax.device_put(jnp.ones((size, size), jnp.float32), device)
    matmul = jax.jit(lambda x: x @ x)
    matmul(a).block_until_ready()
    iterations = 0
    started = time.perf_counter()
    elapsed = 0.0
    while elapsed < min_seconds:
        matmul(a).block_until_ready()
        iterations += 1
        elapsed = time.perf_counter() - started
    gflops = 2.0 * size**3 * iterations / elapsed / 1e9
    return Benchmark(
        matmul_size=size, dtype="float32", iterations=iterations, seconds=elapsed, gflops=gflops
    )


def tpu_chips_present() -> bool:
    """Whether this host has TPU chips (``/dev/accel*`` or ``/dev/vfio/<n>`` devices)."""
    return bool(glob.glob("/dev/accel*") or glob.glob("/dev/vfio/[0-9]*"))


def quiet_libtpu() -> None:
    """On a host without TPU chips, keep libtpu from logging start-up errors.

    libtpu, loaded only to compile for TPU topologies ahead of time, looks for TPU workers
    and prints ``E0000 ... unexpected worker hostname`` lines when it finds none; naming the
    local host as the only worker (``TPU_WORKER_HOSTNAMES``, unless set) silences them. A
    host with chips is left as it is.
    """
    if not tpu_chips_present():
        os.environ.setdefault("TPU_WORKER_HOSTNAMES", "localhost")
        os.environ.setdefault("TPU_SKIP_MDS_QUERY", "1")


def discover(
    *, benchmark: bool = True, aot_targets: tuple[str, ...] = DEFAULT_AOT_TARGETS
) -> Capacity:
    """Read devices and versions from JAX (TPU, then GPU, then CPU) and measure throughput."""
    import importlib

    quiet_libtpu()
    from importlib.metadata import version

    jax: Any = importlib.import_module("jax")
    from jax import export
    from jax.extend.mlir.dialects import stablehlo

    devices = _local_devices(jax)
    first = devices[0]
    return Capacity(
        devices=DeviceInfo(
            platform=str(first.platform),
            device_kind=str(first.device_kind),
            count=len(devices),
            memory_bytes=_memory_bytes(first),
        ),
        jax_version=jax.__version__,
        jaxlib_version=version("jaxlib"),
        calling_convention_min=export.minimum_supported_calling_convention_version,
        calling_convention_max=export.maximum_supported_calling_convention_version,
        stablehlo_min=stablehlo.get_minimum_version(),
        stablehlo_max=stablehlo.get_current_version(),
        compile_targets=_compile_targets(aot_targets),
        benchmark=run_benchmark(first) if benchmark else None,
    )


def capacity_to_wire(capacity: Capacity) -> dict[str, Any]:
    """Encode a capacity as JSON-able data."""
    return asdict(capacity)


def capacity_from_wire(data: dict[str, Any]) -> Capacity:
    """Decode :func:`capacity_to_wire` output."""
    bench = data.get("benchmark")
    return Capacity(
        devices=DeviceInfo(**data["devices"]),
        jax_version=str(data["jax_version"]),
        jaxlib_version=str(data["jaxlib_version"]),
        calling_convention_min=int(data["calling_convention_min"]),
        calling_convention_max=int(data["calling_convention_max"]),
        stablehlo_min=str(data["stablehlo_min"]),
        stablehlo_max=str(data["stablehlo_max"]),
        compile_targets=tuple(CompileTarget(**t) for t in data["compile_targets"]),
        benchmark=None if bench is None else Benchmark(**bench),
    )
