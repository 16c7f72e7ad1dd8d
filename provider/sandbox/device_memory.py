"""Device memory inside a worker: what a target has free, and the diagnoses of too little."""

from __future__ import annotations

from typing import Any

from provider.diagnosis import Category, Diagnosis, Stage, diagnose
from provider.sandbox.figures import total_bytes
from provider.sandbox.limits import SandboxLimits
from provider.sandbox.replies import TaskError
from provider.sandbox.targets import HBM_BYTES_BY_KIND, Target


def rss_vm_bytes() -> int:
    """This process's virtual memory size (0 where /proc cannot be read)."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmSize:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


class DeviceMemory:
    """Answers how many bytes a target's device has free; measures each HBM kind once."""

    def __init__(self, limits: SandboxLimits) -> None:
        """Bound host-memory devices by ``limits``' address space."""
        self.limits = limits
        self._hbm_by_kind: dict[str, int] = {}

    def available_bytes(self, target: Target, device: Any) -> int | None:
        """Bytes free on ``device`` for ``target`` (an AOT target's whole HBM), if known."""
        if target.is_aot:
            return self.hbm_bytes(device)
        try:
            stats = device.memory_stats()
        except Exception:
            stats = None
        if stats and "bytes_limit" in stats:
            return int(stats["bytes_limit"]) - int(stats.get("bytes_in_use", 0))
        return max(0, self.limits.address_space_bytes - rss_vm_bytes())

    def hbm_bytes(self, device: Any) -> int | None:
        """The HBM of ``device``'s kind, measured or from the table of known kinds."""
        kind = str(device.device_kind)
        if kind not in self._hbm_by_kind:
            from provider.capacity import measure_hbm_bytes

            measured = measure_hbm_bytes(device) or HBM_BYTES_BY_KIND.get(kind)
            if measured is None:
                return None
            self._hbm_by_kind[kind] = measured
        return self._hbm_by_kind[kind]

    def outputs_too_large(self, size: int, stage: Stage) -> Diagnosis:
        """The diagnosis of outputs of ``size`` bytes over this provider's cap."""
        cap = self.limits.max_output_bytes
        return diagnose(
            Category.OOM,
            f"the program's outputs need {size} bytes, over this provider's cap of {cap} "
            "bytes of outputs per task",
            stage=stage,
            required_bytes=size,
            available_bytes=cap,
        )

    def check_fits(
        self,
        memory: dict[str, int] | None,
        available: int | None,
        *,
        outputs_checked: bool,
        kind: str,
        target: Target,
    ) -> None:
        """Raise an OOM :class:`TaskError` for a compiled program that cannot fit."""
        outputs_bytes = 0 if memory is None or not outputs_checked else memory["output_bytes"]
        if outputs_bytes > self.limits.max_output_bytes:
            raise TaskError(self.outputs_too_large(outputs_bytes, Stage.COMPILE))
        if memory is None or available is None:
            return
        required = total_bytes(memory)
        if required > available:
            raise TaskError(
                diagnose(
                    Category.OOM,
                    f"program needs {required} bytes of device memory (arguments "
                    f"{memory['argument_bytes']}, outputs {memory['output_bytes']}, "
                    f"temporaries {memory['temp_bytes']}) but {kind} on {target.name} "
                    f"has {available} available",
                    stage=Stage.COMPILE,
                    required_bytes=required,
                    available_bytes=available,
                )
            )
